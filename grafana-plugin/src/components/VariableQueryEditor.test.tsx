import React from 'react';
import { render, screen, fireEvent } from '@testing-library/react';

import { VariableQueryEditor } from './VariableQueryEditor';
import type { DataSource } from '../datasource';
import { VariableQuery } from '../types';

describe('VariableQueryEditor', () => {
  it('filters runs by project, sweep and tag', () => {
    const onChange = vi.fn();
    const q: VariableQuery = { refId: 'V', kind: 'runs' };
    render(<VariableQueryEditor query={q} datasource={{} as DataSource} onChange={onChange} onRunQuery={() => {}} />);
    fireEvent.change(screen.getByLabelText('Project'), { target: { value: '$project' } });
    expect(onChange).toHaveBeenLastCalledWith({ refId: 'V', kind: 'runs', project: '$project' });
    expect(screen.getByLabelText('Tag')).toBeInTheDocument();
  });

  it('asks for a run when listing ranks', () => {
    const q: VariableQuery = { refId: 'V', kind: 'ranks', run: '$run' };
    render(<VariableQueryEditor query={q} datasource={{} as DataSource} onChange={() => {}} onRunQuery={() => {}} />);
    expect(screen.getByLabelText('Run')).toHaveValue('$run');
    expect(screen.queryByLabelText('Project')).not.toBeInTheDocument();
  });
});
