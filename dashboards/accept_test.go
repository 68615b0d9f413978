package dashboards_test

import (
	"encoding/json"

	"github.com/deepseed/deepseed/api"
	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
)

// acceptQuery runs the plugin's own check of a query, so these tests
// prove the plugin's backend accepts every panel query.
func acceptQuery(q api.PluginQuery) error {
	raw, err := json.Marshal(q)
	if err != nil {
		return err
	}
	_, err = plugin.ParseQuery(raw)
	return err
}
