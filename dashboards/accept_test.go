package dashboards_test

import "github.com/deepseed/deepseed/api"

// acceptQuery is the plugin's own check of a query, where the plugin
// exports one.
func acceptQuery(q api.PluginQuery) error { return nil }
