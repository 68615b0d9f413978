import React from 'react';
import { render, screen, fireEvent } from '@testing-library/react';

import { VariableQueryEditor } from './VariableQueryEditor';
import type { DataSource } from '../datasource';
import { VariableQuery } from '../types';

describe('VariableQueryEditor', () => {
  it('filters runs by project, sweep and tag', () => {
    const onChange = vi.fn();
    const q: VariableQuery = { refId: 'V', resource: 'runs' };
    render(<VariableQueryEditor query={q} datasource={{} as DataSource} onChange={onChange} onRunQuery={() => {}} />);
    fireEvent.change(screen.getByLabelText('Project'), { target: { value: '$project' } });
    expect(onChange).toHaveBeenLastCalledWith({ refId: 'V', resource: 'runs', project: '$project' });
    expect(screen.getByLabelText('Tag')).toBeInTheDocument();
  });

  it('asks for a run when listing ranks', () => {
    const q: VariableQuery = { refId: 'V', resource: 'ranks', run: '$run' };
    render(<VariableQueryEditor query={q} datasource={{} as DataSource} onChange={() => {}} onRunQuery={() => {}} />);
    expect(screen.getByLabelText('Run')).toHaveValue('$run');
    expect(screen.queryByLabelText('Project')).not.toBeInTheDocument();
  });

  it('lists sweeps of a project', () => {
    const q: VariableQuery = { refId: 'V', resource: 'sweeps', project: '$project' };
    render(<VariableQueryEditor query={q} datasource={{} as DataSource} onChange={() => {}} onRunQuery={() => {}} />);
    expect(screen.getByLabelText('Project')).toHaveValue('$project');
    expect(screen.queryByLabelText('Run')).not.toBeInTheDocument();
  });

  it('opens a variable saved with kind and saves it back with resource', () => {
    const onChange = vi.fn();
    const old = { refId: 'V', kind: 'ranks', run: '$run' } as unknown as VariableQuery;
    render(<VariableQueryEditor query={old} datasource={{} as DataSource} onChange={onChange} onRunQuery={() => {}} />);
    fireEvent.change(screen.getByLabelText('Run'), { target: { value: 'bert-z2' } });
    expect(onChange).toHaveBeenLastCalledWith({ refId: 'V', resource: 'ranks', run: 'bert-z2' });
  });
});
