package plugin

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/deepseed/deepseed/api"
)

// quotasQuery is the GPU-hour quotas: GET /quotas/{project} for a project,
// else GET /quotas for every one.
var quotasQuery = queryFunc(func(ctx context.Context, d *Datasource, r request) (data.Frames, error) {
	var list []api.Quota
	if p := filterValue(r.Project); p != "" {
		var one api.Quota
		if err := d.client.get(ctx, "/api/v1/quotas/"+url.PathEscape(p), nil, &one); err != nil {
			return nil, err
		}
		list = []api.Quota{one}
	} else {
		var qs api.QuotaList
		if err := d.client.get(ctx, "/api/v1/quotas", nil, &qs); err != nil {
			return nil, err
		}
		list = qs.Quotas
	}
	return data.Frames{quotasFrame(list)}, nil
})

// quotasFrame is one number field per project, the GPU-hours it has used,
// labelled project and limit, with its limit as the field's max (and in
// its display name): a bar gauge draws each project's used / limit. A
// project without a limit has no max.
func quotasFrame(qs []api.Quota) *data.Frame {
	fields := make([]*data.Field, 0, len(qs))
	for _, q := range qs {
		used := q.UsedGPUHours
		cfg := &data.FieldConfig{Unit: api.GPUHoursUnit, Min: ptrConfig(0)}
		limit := "no limit"
		if q.GPUHours != nil {
			cfg.Max = ptrConfig(*q.GPUHours)
			limit = fmt.Sprintf("limit %s GPU-h", strconv.FormatFloat(*q.GPUHours, 'g', -1, 64))
		}
		cfg.DisplayNameFromDS = fmt.Sprintf("%s (%s)", q.Project, limit)
		// The limit is a label too: a bar gauge of one project hides a
		// name from the data source, and its panel names the bar from
		// the labels instead.
		labels := data.Labels{"project": q.Project, "limit": limit}
		fields = append(fields, numericField("used_gpu_hours", api.GPUHoursUnit, labels, &used).SetConfig(cfg))
	}
	f := numericFrame("quotas", fields)
	limits := map[string]any{}
	for _, q := range qs {
		limits[q.Project] = q.GPUHours
	}
	f.Meta.Custom = map[string]any{"limits": limits}
	return f
}

func ptrConfig(v float64) *data.ConfFloat64 { c := data.ConfFloat64(v); return &c }
