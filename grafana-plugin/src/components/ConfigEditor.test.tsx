import React from 'react';
import { render, screen, fireEvent } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { DataSourceSettings } from '@grafana/data';

import { ConfigEditor } from './ConfigEditor';
import { DeepSeedOptions, DeepSeedSecureOptions } from '../types';

function settings(over: Partial<DataSourceSettings<DeepSeedOptions, DeepSeedSecureOptions>> = {}) {
  return {
    id: 1,
    uid: 'ds',
    orgId: 1,
    name: 'DeepSeed',
    type: 'deepseed-telemetry-datasource',
    typeName: 'DeepSeed',
    typeLogoUrl: '',
    access: 'proxy',
    url: '',
    user: '',
    database: '',
    basicAuth: false,
    basicAuthUser: '',
    isDefault: false,
    readOnly: false,
    withCredentials: false,
    jsonData: { url: 'http://deepseed:8080' },
    secureJsonFields: {},
    ...over,
  } as DataSourceSettings<DeepSeedOptions, DeepSeedSecureOptions>;
}

describe('ConfigEditor', () => {
  it('edits the server URL in jsonData', () => {
    const onOptionsChange = vi.fn();
    render(<ConfigEditor options={settings()} onOptionsChange={onOptionsChange} />);
    const url = screen.getByLabelText('Server URL');
    expect(url).toHaveValue('http://deepseed:8080');
    fireEvent.change(url, { target: { value: 'https://telemetry.example' } });
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ jsonData: expect.objectContaining({ url: 'https://telemetry.example' }) })
    );
  });

  it('puts the token in secureJsonData, never in jsonData', () => {
    const onOptionsChange = vi.fn();
    render(<ConfigEditor options={settings()} onOptionsChange={onOptionsChange} />);
    fireEvent.change(screen.getByLabelText('Read token'), { target: { value: 's3cret' } });
    const next = onOptionsChange.mock.lastCall![0];
    expect(next.secureJsonData).toEqual({ token: 's3cret' });
    expect(JSON.stringify(next.jsonData)).not.toContain('s3cret');
  });

  it('shows a saved token as configured and resets it', async () => {
    const onOptionsChange = vi.fn();
    render(<ConfigEditor options={settings({ secureJsonFields: { token: true } })} onOptionsChange={onOptionsChange} />);
    expect(screen.getByLabelText('Read token')).toHaveValue('configured');
    await userEvent.click(screen.getByRole('button', { name: 'Reset' }));
    expect(onOptionsChange).toHaveBeenLastCalledWith(
      expect.objectContaining({ secureJsonFields: { token: false }, secureJsonData: { token: '' } })
    );
  });
});
