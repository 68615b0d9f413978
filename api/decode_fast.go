package api

// The fast decoder's state and its entry points (record, array, object).
// Its parts lie beside it: the scanner in decode_fast_scan.go, values in
// decode_fast_values.go, the fields of each record kind in
// decode_fast_kinds.go.

// fastDecoder decodes the records that make up nearly all of the ingest
// traffic (step, layers and eval) without encoding/json: one pass over the
// bytes, no reflection, one allocation for a record's struct and its
// numbers, and repeated strings (run ids, layer names) shared.
//
// It only accepts what it is sure encoding/json decodes to the same record:
// "kind" as the first key, each known key at most once, strings without
// escapes, numbers in JSON syntax, bare or quoted NaN and infinities where a
// [Float] goes. Anything else (unknown keys, null, escapes, other kinds,
// invalid records) makes it give up, and the caller decodes the record the
// general way, so that what is accepted and every error message stay those
// of [DecodeRecord]'s general path. FuzzFastDecoder checks that both paths
// agree.
type fastDecoder struct {
	b []byte
	i int

	strs    map[string]string // interned strings
	floats  []Float           // scratch for arrays
	strList []string          // scratch for arrays

	// The last string array and its JSON text: every layers record of a
	// run usually lists the same names, and records then share one slice.
	lastStrsRaw []byte
	lastStrs    []string

	// The last time literal and its value: every rank of a step usually
	// carries the same time.
	timeRaw  []byte
	timeLast Time
}

// maxInterned bounds the interned strings of one batch.
const maxInterned = 4096

func (d *fastDecoder) reset(b []byte) {
	d.b, d.i = b, 0
}

// record decodes one validated record from the whole of b. ok is false
// when the general path must decide.
func (d *fastDecoder) record(b []byte) (Record, bool) {
	d.reset(b)
	rec, ok := d.object()
	if !ok {
		return Record{}, false
	}
	d.ws()
	if d.i != len(d.b) || validate(rec) != nil {
		return Record{}, false
	}
	return rec, true
}

// array decodes a JSON array of records, the whole of b. ok is false when
// the general path must decide (including for every invalid batch).
func (d *fastDecoder) array(b []byte) ([]Record, bool) {
	d.reset(b)
	if !d.eat('[') {
		return nil, false
	}
	d.ws()
	if d.peek() == ']' {
		return nil, false
	}
	var out []Record
	for {
		if len(out) >= MaxBatchRecords {
			return nil, false
		}
		rec, ok := d.object()
		if !ok {
			return nil, false
		}
		out = append(out, rec)
		d.ws()
		if d.eat(',') {
			d.ws()
			continue
		}
		if !d.eat(']') {
			return nil, false
		}
		break
	}
	d.ws()
	if d.i != len(d.b) {
		return nil, false
	}
	for _, rec := range out {
		if validate(rec) != nil {
			return nil, false
		}
	}
	return out, true
}

// object decodes one record object starting at the current position.
func (d *fastDecoder) object() (Record, bool) {
	d.ws()
	if !d.eat('{') {
		return Record{}, false
	}
	d.ws()
	k, ok := d.key()
	if !ok || string(k) != "kind" {
		return Record{}, false
	}
	kind, ok := d.rawString()
	if !ok {
		return Record{}, false
	}
	more, ok := d.next()
	if !ok {
		return Record{}, false
	}
	switch string(kind) {
	case KindStep:
		return d.step(more)
	case KindLayers:
		return d.layers(more)
	case KindEval:
		return d.eval(more)
	}
	return Record{}, false
}
