// Builds dist/module.js as the AMD module Grafana loads, with Grafana's
// shared libraries left external (Grafana provides them at run time), as
// @grafana/create-plugin does.
const path = require('path');
const CopyWebpackPlugin = require('copy-webpack-plugin');
const pkg = require('./package.json');

const today = new Date().toISOString().slice(0, 10);

module.exports = (env, argv) => ({
  mode: argv.mode || 'production',
  target: 'web',
  context: path.join(__dirname, 'src'),
  entry: { module: './module.ts' },
  devtool: argv.mode === 'development' ? 'eval-source-map' : 'source-map',
  output: {
    path: path.resolve(__dirname, 'dist'),
    filename: '[name].js',
    library: { type: 'amd' },
    publicPath: `public/plugins/${require('./src/plugin.json').id}/`,
    uniqueName: 'deepseed-telemetry-datasource',
    clean: { keep: /^gpx_/ },
  },
  externals: [
    'lodash',
    'jquery',
    'moment',
    'slate',
    'emotion',
    '@emotion/react',
    '@emotion/css',
    'prismjs',
    'react',
    'react-dom',
    'react-redux',
    'redux',
    'rxjs',
    'react-router',
    'react-router-dom',
    'd3',
    'angular',
    '@grafana/ui',
    '@grafana/runtime',
    '@grafana/data',
    // Grafana also exposes its internal modules under grafana/…
    ({ request }, callback) => {
      const prefix = 'grafana/';
      if (request && request.indexOf(prefix) === 0) {
        return callback(undefined, request.slice(prefix.length));
      }
      callback();
    },
  ],
  resolve: { extensions: ['.ts', '.tsx', '.js'] },
  module: {
    rules: [
      {
        test: /\.tsx?$/,
        exclude: /node_modules/,
        use: {
          loader: 'ts-loader',
          options: { transpileOnly: true, compilerOptions: { noEmit: false, module: 'esnext', sourceMap: true } },
        },
      },
    ],
  },
  plugins: [
    new CopyWebpackPlugin({
      patterns: [
        {
          from: 'plugin.json',
          to: '.',
          transform: (content) =>
            content.toString().replace('%VERSION%', pkg.version).replace('%TODAY%', today),
        },
        { from: 'img', to: 'img' },
        { from: '../README.md', to: '.' },
        { from: '../CHANGELOG.md', to: '.' },
        { from: '../LICENSE', to: '.', noErrorOnMissing: true },
      ],
    }),
  ],
  performance: { hints: false },
});
