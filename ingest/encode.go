package ingest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"

	"github.com/deepseed/deepseed/api"
)

// EncodeNDJSON writes records as NDJSON, gzipped when zip is set, as the
// collector sends them.
func EncodeNDJSON(recs []api.Record, zip bool) ([]byte, error) {
	var buf bytes.Buffer
	var enc *json.Encoder
	var zw *gzip.Writer
	if zip {
		zw = gzip.NewWriter(&buf)
		enc = json.NewEncoder(zw)
	} else {
		enc = json.NewEncoder(&buf)
	}
	for _, r := range recs {
		if err := enc.Encode(recordValue(r)); err != nil {
			return nil, fmt.Errorf("encode %s record: %w", r.Kind(), err)
		}
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

func recordValue(r api.Record) any {
	switch {
	case r.Run != nil:
		return r.Run
	case r.Step != nil:
		return r.Step
	case r.Layers != nil:
		return r.Layers
	case r.Eval != nil:
		return r.Eval
	case r.GPU != nil:
		return r.GPU
	case r.Host != nil:
		return r.Host
	case r.Memory != nil:
		return r.Memory
	case r.Event != nil:
		return r.Event
	case r.End != nil:
		return r.End
	case r.Process != nil:
		return r.Process
	}
	return nil
}
