// Package models holds the data source's settings as Grafana stores them:
// public ones in jsonData, the read token in secureJsonData.
package models

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
)

// DefaultTimeout bounds one call to the query service when the settings
// name none.
const DefaultTimeout = 30 * time.Second

// PluginSettings is one configured DeepSeed data source.
type PluginSettings struct {
	// URL is the DeepSeed server's base URL, e.g. http://deepseed:8080;
	// the API lives under URL + /api/v1.
	URL string `json:"url"`
	// TimeoutSeconds bounds one call to the query service.
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`

	// Secrets never leave the backend: Grafana decrypts them for the
	// plugin only and the browser sees just whether they are set.
	Secrets *SecretPluginSettings `json:"-"`
}

// SecretPluginSettings holds what comes from secureJsonData.
type SecretPluginSettings struct {
	// Token is a read (or ingest) token of the DeepSeed server, sent as
	// "Authorization: Bearer …". Empty when the server runs open.
	Token string
}

// Timeout returns the per-call timeout.
func (s *PluginSettings) Timeout() time.Duration {
	if s.TimeoutSeconds <= 0 {
		return DefaultTimeout
	}
	return time.Duration(s.TimeoutSeconds) * time.Second
}

// LoadPluginSettings reads and checks the settings of one data source
// instance. The URL comes from jsonData.url, or else from the data
// source's own URL field.
func LoadPluginSettings(source backend.DataSourceInstanceSettings) (*PluginSettings, error) {
	settings := PluginSettings{}
	if len(source.JSONData) > 0 {
		if err := json.Unmarshal(source.JSONData, &settings); err != nil {
			return nil, fmt.Errorf("settings: read jsonData: %w", err)
		}
	}
	if settings.URL == "" {
		settings.URL = source.URL
	}
	settings.URL = strings.TrimRight(strings.TrimSpace(settings.URL), "/")
	if settings.URL == "" {
		return nil, fmt.Errorf("settings: url: the DeepSeed server URL is not set")
	}
	u, err := url.Parse(settings.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("settings: url %q: want http://host:port or https://host", settings.URL)
	}
	if settings.TimeoutSeconds < 0 {
		return nil, fmt.Errorf("settings: timeoutSeconds %d: must not be negative", settings.TimeoutSeconds)
	}
	settings.Secrets = &SecretPluginSettings{Token: strings.TrimSpace(source.DecryptedSecureJSONData["token"])}
	return &settings, nil
}
