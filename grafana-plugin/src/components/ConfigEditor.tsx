import React, { ChangeEvent } from 'react';
import { DataSourcePluginOptionsEditorProps } from '@grafana/data';
import { InlineField, Input, SecretInput } from '@grafana/ui';

import { DeepSeedOptions, DeepSeedSecureOptions } from '../types';

type Props = DataSourcePluginOptionsEditorProps<DeepSeedOptions, DeepSeedSecureOptions>;

/**
 * ConfigEditor edits the server URL (jsonData) and the read token
 * (secureJsonData). Once saved, the token is never sent back to the
 * browser: the field only shows that one is configured and can reset it.
 */
export function ConfigEditor({ options, onOptionsChange }: Props) {
  const { jsonData, secureJsonFields } = options;
  const secureJsonData = (options.secureJsonData || {}) as DeepSeedSecureOptions;

  const onURLChange = (event: ChangeEvent<HTMLInputElement>) => {
    onOptionsChange({ ...options, jsonData: { ...jsonData, url: event.target.value } });
  };
  const onTimeoutChange = (event: ChangeEvent<HTMLInputElement>) => {
    const n = parseInt(event.target.value, 10);
    onOptionsChange({ ...options, jsonData: { ...jsonData, timeoutSeconds: Number.isFinite(n) && n > 0 ? n : undefined } });
  };
  const onTokenChange = (event: ChangeEvent<HTMLInputElement>) => {
    onOptionsChange({ ...options, secureJsonData: { ...secureJsonData, token: event.target.value } });
  };
  const onResetToken = () => {
    onOptionsChange({
      ...options,
      secureJsonFields: { ...secureJsonFields, token: false },
      secureJsonData: { ...secureJsonData, token: '' },
    });
  };

  return (
    <>
      <InlineField label="Server URL" labelWidth={16} tooltip="Base URL of the DeepSeed server, e.g. http://deepseed:8080">
        <Input
          id="deepseed-url"
          aria-label="Server URL"
          value={jsonData.url || ''}
          placeholder="http://deepseed:8080"
          width={48}
          onChange={onURLChange}
        />
      </InlineField>
      <InlineField label="Read token" labelWidth={16} tooltip="A read (or ingest) token of the server; stays in Grafana's encrypted store">
        <SecretInput
          id="deepseed-token"
          aria-label="Read token"
          isConfigured={Boolean(secureJsonFields && secureJsonFields.token)}
          value={secureJsonData.token || ''}
          placeholder="token from DEEPSEED_READ_TOKENS"
          width={48}
          onReset={onResetToken}
          onChange={onTokenChange}
        />
      </InlineField>
      <InlineField label="Timeout (s)" labelWidth={16} tooltip="Bound on one call to the query service; 30 when empty">
        <Input
          id="deepseed-timeout"
          aria-label="Timeout"
          type="number"
          value={jsonData.timeoutSeconds ?? ''}
          placeholder="30"
          width={12}
          onChange={onTimeoutChange}
        />
      </InlineField>
    </>
  );
}
