package dashboards

import (
	"encoding/json"
	"reflect"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"

	"github.com/deepseed/deepseed/api"
)

// Data source identity shared by every panel, variable and annotation, and
// by the provisioning file that creates the data source.
const (
	PluginID      = "deepseed-telemetry-datasource"
	DatasourceUID = "deepseed"
)

// DatasourceRef points at the provisioned DeepSeed data source.
func DatasourceRef() common.DataSourceRef {
	t, u := PluginID, DatasourceUID
	return common.DataSourceRef{Type: &t, Uid: &u}
}

// Query is one panel target: exactly an [api.PluginQuery] plus the refId
// and data source Grafana keeps beside every query. It implements the
// SDK's Dataquery variant so panels can hold it as a target.
type Query struct {
	api.PluginQuery
	RefID      string               `json:"refId"`
	Hide       bool                 `json:"hide,omitempty"`
	Datasource common.DataSourceRef `json:"datasource"`
}

var _ variants.Dataquery = Query{}

// ImplementsDataqueryVariant implements variants.Dataquery.
func (Query) ImplementsDataqueryVariant() {}

// DataqueryType implements variants.Dataquery.
func (Query) DataqueryType() string { return PluginID }

// Validate implements variants.Dataquery.
func (Query) Validate() error { return nil }

// Equals implements variants.Dataquery.
func (q Query) Equals(other variants.Dataquery) bool {
	o, ok := other.(Query)
	return ok && reflect.DeepEqual(q, o)
}

// QueryVariantConfig lets the SDK decode DeepSeed targets when it reads a
// dashboard back, so tests can round-trip the generated JSON.
func QueryVariantConfig() variants.DataqueryConfig {
	dec := func(raw []byte) (variants.Dataquery, error) {
		var q Query
		if err := json.Unmarshal(raw, &q); err != nil {
			return nil, err
		}
		return q, nil
	}
	return variants.DataqueryConfig{Identifier: PluginID, DataqueryUnmarshaler: dec, StrictDataqueryUnmarshaler: dec}
}

// queryBuilder adapts a [Query] to the SDK's builder interface.
type queryBuilder struct{ q Query }

var _ cog.Builder[variants.Dataquery] = queryBuilder{}

func (b queryBuilder) Build() (variants.Dataquery, error) { return b.q, nil }

// target makes the panel target refID from q.
func target(refID string, q api.PluginQuery) queryBuilder {
	return queryBuilder{Query{PluginQuery: q, RefID: refID, Datasource: DatasourceRef()}}
}
