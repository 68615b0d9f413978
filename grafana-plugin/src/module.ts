import { DataSourcePlugin } from '@grafana/data';

import { ConfigEditor } from './components/ConfigEditor';
import { QueryEditor } from './components/QueryEditor';
import { DataSource } from './datasource';
import { DeepSeedOptions, DeepSeedQuery } from './types';

export const plugin = new DataSourcePlugin<DataSource, DeepSeedQuery, DeepSeedOptions>(DataSource)
  .setConfigEditor(ConfigEditor)
  .setQueryEditor(QueryEditor);
