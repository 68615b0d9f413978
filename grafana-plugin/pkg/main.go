// Command gpx_deepseed is the backend of the DeepSeed Grafana data source.
// Grafana starts it and talks to it over gRPC; all the work happens in
// package plugin.
package main

import (
	"os"

	"github.com/grafana/grafana-plugin-sdk-go/backend/datasource"
	"github.com/grafana/grafana-plugin-sdk-go/backend/log"

	"github.com/deepseed/deepseed/grafana-plugin/pkg/plugin"
)

func main() {
	if err := datasource.Manage(plugin.PluginID, plugin.NewDatasource, datasource.ManageOpts{}); err != nil {
		log.DefaultLogger.Error("deepseed datasource stopped", "error", err.Error())
		os.Exit(1)
	}
}
