package models

import (
	"strings"
	"testing"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
)

func TestLoadPluginSettings(t *testing.T) {
	s, err := LoadPluginSettings(backend.DataSourceInstanceSettings{
		JSONData:                []byte(`{"url":"http://deepseed:8080/"}`),
		DecryptedSecureJSONData: map[string]string{"token": " secret "},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.URL != "http://deepseed:8080" || s.Secrets.Token != "secret" || s.Timeout() != DefaultTimeout {
		t.Fatalf("got %+v token %q", s, s.Secrets.Token)
	}

	s, err = LoadPluginSettings(backend.DataSourceInstanceSettings{URL: "https://ds.example"})
	if err != nil || s.URL != "https://ds.example" || s.Secrets.Token != "" {
		t.Fatalf("fallback to the instance URL: %+v %v", s, err)
	}

	for _, bad := range []string{`{}`, `{"url":"deepseed:8080"}`, `{"url":"ftp://x"}`, `{"url":"http://x","timeoutSeconds":-1}`, `{`} {
		_, err := LoadPluginSettings(backend.DataSourceInstanceSettings{JSONData: []byte(bad)})
		if err == nil || !strings.HasPrefix(err.Error(), "settings: ") {
			t.Errorf("%s: want a settings error, got %v", bad, err)
		}
	}
}
