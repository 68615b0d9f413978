package api

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
)

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

func (d *fastDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *fastDecoder) eat(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// ws skips JSON whitespace.
func (d *fastDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// rawString reads a string without escapes and returns its bytes, which
// alias the input. Invalid UTF-8 gives up: encoding/json would replace it.
func (d *fastDecoder) rawString() ([]byte, bool) {
	if d.peek() != '"' {
		return nil, false
	}
	start := d.i + 1
	ascii := true
	for j := start; j < len(d.b); j++ {
		c := d.b[j]
		switch {
		case c == '"':
			s := d.b[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			d.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

func (d *fastDecoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if d.strs == nil {
		d.strs = make(map[string]string, 64)
	}
	if len(d.strs) < maxInterned {
		d.strs[s] = s
	}
	return s
}

func (d *fastDecoder) str() (string, bool) {
	b, ok := d.rawString()
	if !ok {
		return "", false
	}
	return d.intern(b), true
}

// key reads an object key and the colon after it.
func (d *fastDecoder) key() ([]byte, bool) {
	k, ok := d.rawString()
	if !ok {
		return nil, false
	}
	d.ws()
	if !d.eat(':') {
		return nil, false
	}
	d.ws()
	return k, true
}

// next moves past the separator after a member: more is true at a comma
// (and the next key follows), false at the closing brace.
func (d *fastDecoder) next() (more, ok bool) {
	d.ws()
	switch d.peek() {
	case ',':
		d.i++
		d.ws()
		return true, true
	case '}':
		d.i++
		return false, true
	}
	return false, false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number reads a number in JSON syntax and returns its literal.
func (d *fastDecoder) number() (lit []byte, isInt, ok bool) {
	b, j := d.b, d.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	default:
		return nil, false, false
	}
	isInt = true
	if j < len(b) && b[j] == '.' {
		isInt = false
		j++
		if j >= len(b) || !isDigit(b[j]) {
			return nil, false, false
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		isInt = false
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || !isDigit(b[j]) {
			return nil, false, false
		}
		for j < len(b) && isDigit(b[j]) {
			j++
		}
	}
	lit = b[d.i:j]
	d.i = j
	return lit, isInt, true
}

// int64Val reads an integer as encoding/json does for int fields.
func (d *fastDecoder) int64Val() (int64, bool) {
	lit, isInt, ok := d.number()
	if !ok || !isInt {
		return 0, false
	}
	digits := lit
	neg := lit[0] == '-'
	if neg {
		digits = lit[1:]
	}
	if len(digits) > 18 {
		v, err := strconv.ParseInt(string(lit), 10, 64)
		return v, err == nil
	}
	var v int64
	for _, c := range digits {
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// floatVal reads what [Float.UnmarshalJSON] accepts after [NormalizeJSON]:
// a number, or a bare or quoted NaN or infinity.
func (d *fastDecoder) floatVal() (Float, bool) {
	rest := d.b[d.i:]
	switch d.peek() {
	case '"':
		s, ok := d.rawString()
		if !ok || len(s) > len("-Infinity") {
			return 0, false
		}
		v, ok := ParseNonFinite(string(s))
		return Float(v), ok
	case 'N':
		if bytes.HasPrefix(rest, []byte("NaN")) {
			d.i += 3
			return Float(math.NaN()), true
		}
		return 0, false
	case 'I':
		if bytes.HasPrefix(rest, []byte("Infinity")) {
			d.i += 8
			return Float(math.Inf(1)), true
		}
		return 0, false
	case '-':
		if bytes.HasPrefix(rest, []byte("-Infinity")) {
			d.i += 9
			return Float(math.Inf(-1)), true
		}
	}
	v, n, exact := exactFloatPrefix(rest)
	if n == 0 {
		return 0, false
	}
	d.i += n
	if exact {
		return Float(v), true
	}
	v, err := strconv.ParseFloat(string(rest[:n]), 64)
	if err != nil {
		// As Float.UnmarshalJSON: out-of-range literals become ±Inf.
		if ne, ok := err.(*strconv.NumError); !ok || ne.Err != strconv.ErrRange {
			return 0, false
		}
	}
	return Float(v), true
}

// timeVal reads what [Time.UnmarshalJSON] accepts: an RFC 3339 string or
// Unix seconds.
func (d *fastDecoder) timeVal() (Time, bool) {
	start := d.i
	var lit []byte
	quoted := d.peek() == '"'
	if quoted {
		s, ok := d.rawString()
		if !ok {
			return Time{}, false
		}
		lit = s
	} else {
		l, _, ok := d.number()
		if !ok {
			return Time{}, false
		}
		lit = l
	}
	raw := d.b[start:d.i]
	if d.timeRaw != nil && bytes.Equal(raw, d.timeRaw) {
		return d.timeLast, true
	}
	var t Time
	if quoted {
		v, err := ParseTime(string(lit))
		if err != nil {
			return Time{}, false
		}
		t.Time = v
	} else {
		f, err := strconv.ParseFloat(string(lit), 64)
		if err != nil {
			return Time{}, false
		}
		v, err := UnixSeconds(f)
		if err != nil {
			return Time{}, false
		}
		t.Time = v
	}
	d.timeRaw = append(d.timeRaw[:0], raw...)
	d.timeLast = t
	return t, true
}

func (d *fastDecoder) boolVal() (bool, bool) {
	rest := d.b[d.i:]
	switch {
	case bytes.HasPrefix(rest, []byte("true")):
		d.i += 4
		return true, true
	case bytes.HasPrefix(rest, []byte("false")):
		d.i += 5
		return false, true
	}
	return false, false
}

func (d *fastDecoder) floatArray() ([]Float, bool) {
	if !d.eat('[') {
		return nil, false
	}
	d.ws()
	if d.eat(']') {
		return []Float{}, true
	}
	d.floats = d.floats[:0]
	for {
		v, ok := d.floatVal()
		if !ok {
			return nil, false
		}
		d.floats = append(d.floats, v)
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
	return append([]Float(nil), d.floats...), true
}

func (d *fastDecoder) stringArray() ([]string, bool) {
	start := d.i
	if n := len(d.lastStrsRaw); n > 0 && bytes.HasPrefix(d.b[start:], d.lastStrsRaw) {
		// The same text from '[' to ']' decodes to the same strings.
		d.i += n
		return d.lastStrs, true
	}
	if !d.eat('[') {
		return nil, false
	}
	d.ws()
	if d.eat(']') {
		return []string{}, true
	}
	d.strList = d.strList[:0]
	for {
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		d.strList = append(d.strList, s)
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
	out := append([]string(nil), d.strList...)
	d.lastStrsRaw, d.lastStrs = d.b[start:d.i], out
	return out, true
}

func (d *fastDecoder) metrics() (map[string]Float, bool) {
	if !d.eat('{') {
		return nil, false
	}
	m := map[string]Float{}
	d.ws()
	if d.eat('}') {
		return m, true
	}
	for {
		k, ok := d.key()
		if !ok {
			return nil, false
		}
		v, ok := d.floatVal()
		if !ok {
			return nil, false
		}
		// encoding/json keeps the last of repeated keys, as this does.
		m[d.intern(k)] = v
		more, ok := d.next()
		if !ok {
			return nil, false
		}
		if !more {
			return m, true
		}
	}
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

// stepBox holds a step record and everything its pointers point at, so
// that a step costs one allocation.
type stepBox struct {
	s       Step
	step    int64
	samples int64
	tokens  int64
	skipped bool
	time    Time
	syncNS  int64
	floats  [20]Float
}

// onceStr reads a string into *dst, refusing a key seen before.
func (d *fastDecoder) onceStr(seen *bool, dst *string) bool {
	if *seen {
		return false
	}
	*seen = true
	v, ok := d.str()
	*dst = v
	return ok
}

// onceRank reads a rank into *dst, refusing a key seen before.
func (d *fastDecoder) onceRank(seen *bool, dst *int) bool {
	if *seen {
		return false
	}
	*seen = true
	v, ok := d.int64Val()
	*dst = int(v)
	return ok
}

// onceInto reads a value with read into the record's box slot and points
// the record's field at it, refusing a field already set.
func onceInto[T any](field **T, slot *T, read func() (T, bool)) bool {
	if *field != nil {
		return false
	}
	v, ok := read()
	if !ok {
		return false
	}
	*slot = v
	*field = slot
	return true
}

func (d *fastDecoder) step(more bool) (Record, bool) {
	box := &stepBox{}
	s := &box.s
	s.Kind = KindStep
	nf := 0
	var seenRunID, seenRank bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		var fp **Float
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &s.RunID) {
				return Record{}, false
			}
		case "rank":
			if !d.onceRank(&seenRank, &s.Rank) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&s.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "samples":
			if !onceInto(&s.Samples, &box.samples, d.int64Val) {
				return Record{}, false
			}
		case "tokens":
			if !onceInto(&s.Tokens, &box.tokens, d.int64Val) {
				return Record{}, false
			}
		case "sync_ns":
			if !onceInto(&s.SyncNS, &box.syncNS, d.int64Val) {
				return Record{}, false
			}
		case "skipped":
			if !onceInto(&s.Skipped, &box.skipped, d.boolVal) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&s.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "metrics":
			if s.Metrics != nil {
				return Record{}, false
			}
			if s.Metrics, ok = d.metrics(); !ok {
				return Record{}, false
			}
		case "epoch":
			fp = &s.Epoch
		case "loss":
			fp = &s.Loss
		case "lr":
			fp = &s.LR
		case "grad_norm":
			fp = &s.GradNorm
		case "loss_scale":
			fp = &s.LossScale
		case "throughput_sps":
			fp = &s.ThroughputSPS
		case "throughput_tps":
			fp = &s.ThroughputTPS
		case "step_ms":
			fp = &s.StepMS
		case "forward_ms":
			fp = &s.ForwardMS
		case "backward_ms":
			fp = &s.BackwardMS
		case "optimizer_ms":
			fp = &s.OptimizerMS
		case "comm_ms":
			fp = &s.CommMS
		case "data_ms":
			fp = &s.DataMS
		case "gpu_util_pct":
			fp = &s.GPUUtilPct
		case "gpu_mem_used_gb":
			fp = &s.GPUMemUsedGB
		case "gpu_mem_peak_gb":
			fp = &s.GPUMemPeakGB
		case "gpu_mem_reserved_gb":
			fp = &s.GPUMemResvGB
		case "cpu_util_pct":
			fp = &s.CPUUtilPct
		case "tflops":
			fp = &s.TFLOPS
		case "mfu":
			fp = &s.MFU
		case "sync_wait_ms":
			fp = &s.SyncWaitMS
		case "input_wait_ms":
			fp = &s.InputWaitMS
		default:
			// "kind" again, unknown keys, keys in another case.
			return Record{}, false
		}
		if fp != nil {
			if *fp != nil {
				return Record{}, false
			}
			v, ok := d.floatVal()
			if !ok {
				return Record{}, false
			}
			box.floats[nf] = v
			*fp = &box.floats[nf]
			nf++
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Step: s}, true
}

type layersBox struct {
	l    Layers
	step int64
	time Time
}

func (d *fastDecoder) layers(more bool) (Record, bool) {
	box := &layersBox{}
	l := &box.l
	l.Kind = KindLayers
	var seenRunID, seenRank bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &l.RunID) {
				return Record{}, false
			}
		case "rank":
			if !d.onceRank(&seenRank, &l.Rank) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&l.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&l.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "names":
			if l.Names != nil {
				return Record{}, false
			}
			if l.Names, ok = d.stringArray(); !ok {
				return Record{}, false
			}
		case "forward_ms":
			if l.ForwardMS != nil {
				return Record{}, false
			}
			if l.ForwardMS, ok = d.floatArray(); !ok {
				return Record{}, false
			}
		case "backward_ms":
			if l.BackwardMS != nil {
				return Record{}, false
			}
			if l.BackwardMS, ok = d.floatArray(); !ok {
				return Record{}, false
			}
		default:
			return Record{}, false
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Layers: l}, true
}

type evalBox struct {
	e      Eval
	step   int64
	time   Time
	floats [3]Float
}

func (d *fastDecoder) eval(more bool) (Record, bool) {
	box := &evalBox{}
	e := &box.e
	e.Kind = KindEval
	nf := 0
	var seenRunID, seenSplit bool
	for more {
		k, ok := d.key()
		if !ok {
			return Record{}, false
		}
		var fp **Float
		switch string(k) {
		case "run_id":
			if !d.onceStr(&seenRunID, &e.RunID) {
				return Record{}, false
			}
		case "split":
			if !d.onceStr(&seenSplit, &e.Split) {
				return Record{}, false
			}
		case "step":
			if !onceInto(&e.Step, &box.step, d.int64Val) {
				return Record{}, false
			}
		case "time":
			if !onceInto(&e.Time, &box.time, d.timeVal) {
				return Record{}, false
			}
		case "metrics":
			if e.Metrics != nil {
				return Record{}, false
			}
			if e.Metrics, ok = d.metrics(); !ok {
				return Record{}, false
			}
		case "loss":
			fp = &e.Loss
		case "accuracy":
			fp = &e.Accuracy
		case "f1":
			fp = &e.F1
		default:
			return Record{}, false
		}
		if fp != nil {
			if *fp != nil {
				return Record{}, false
			}
			v, ok := d.floatVal()
			if !ok {
				return Record{}, false
			}
			box.floats[nf] = v
			*fp = &box.floats[nf]
			nf++
		}
		if more, ok = d.next(); !ok {
			return Record{}, false
		}
	}
	return Record{Eval: e}, true
}

// pow10 holds the powers of ten that float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// exactFloatPrefix finds the JSON number at the start of lit and returns
// its length n, 0 when lit does not start with one (a leading zero
// followed by digits, a dot or an exponent without digits).
//
// Most metrics are numbers whose digits, read as an integer, are at most
// 2^53, with a small decimal exponent. Those digits fit a float64 exactly,
// as does a power of ten up to 1e22, and one multiplication or division
// rounds correctly: for such a number it also returns the value, which is
// strconv.ParseFloat's, and exact true. For any other the caller converts
// lit[:n] the general way, without scanning it again.
func exactFloatPrefix(lit []byte) (f float64, n int, exact bool) {
	i := 0
	neg := false
	if i < len(lit) && lit[i] == '-' {
		neg = true
		i++
	}
	// mant takes significant digits while it is at most 2^53; past that
	// the number is inexact, and the scan only finds where it ends.
	var mant uint64
	inexact := false
	exp := 0
	switch {
	case i < len(lit) && lit[i] == '0':
		i++
	case i < len(lit) && lit[i] >= '1' && lit[i] <= '9':
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if mant = mant*10 + uint64(lit[i]-'0'); mant > 1<<53 {
				inexact = true
				for i++; i < len(lit) && isDigit(lit[i]); i++ {
				}
				break
			}
		}
	default:
		return 0, 0, false
	}
	if i < len(lit) && lit[i] == '.' {
		i++
		if i >= len(lit) || !isDigit(lit[i]) {
			return 0, 0, false
		}
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if inexact {
				continue
			}
			if mant = mant*10 + uint64(lit[i]-'0'); mant > 1<<53 {
				inexact = true
			}
			exp--
		}
	}
	if i < len(lit) && (lit[i] == 'e' || lit[i] == 'E') {
		i++
		eneg := false
		if i < len(lit) && (lit[i] == '+' || lit[i] == '-') {
			eneg = lit[i] == '-'
			i++
		}
		if i >= len(lit) || !isDigit(lit[i]) {
			return 0, 0, false
		}
		e := 0
		for ; i < len(lit) && isDigit(lit[i]); i++ {
			if e < 100000 {
				e = e*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	f = float64(mant)
	switch {
	case inexact:
		return 0, i, false
	case mant == 0:
	case exp >= 0 && exp < len(pow10):
		f *= pow10[exp]
	case exp < 0 && -exp < len(pow10):
		f /= pow10[-exp]
	default:
		return 0, i, false
	}
	if neg {
		f = -f
	}
	return f, i, true
}
