package jobs

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// MaxTrials bounds the jobs one sweep may queue.
const MaxTrials = 1000

var (
	paramName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	placeholder = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\}`)
)

// inputError is a 400 naming the field at fault.
type inputError struct{ field, msg string }

func (e *inputError) Error() string { return e.field + ": " + e.msg }

func bad(field, format string, args ...any) error {
	return &inputError{field: field, msg: fmt.Sprintf(format, args...)}
}

// checkArgv checks a command: at least a program, no empty program,
// bounded in size (decode has refused NUL bytes in every string).
func checkArgv(argv []string) error {
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" {
		return bad("argv", "the command is empty: give the program and its arguments, e.g. [\"python\", \"train.py\"]")
	}
	size := 0
	for _, a := range argv {
		size += len(a)
	}
	if size > 64<<10 || len(argv) > 4096 {
		return bad("argv", "the command is longer than 64 KiB or 4096 items")
	}
	return nil
}

// checkQueued checks the fields a job submission and a sweep share, in
// the order their errors are reported: the project, the argv, then the
// retries. A missing GPU count (0) becomes 1; the count itself is checked
// last, against the agents, by Handler.checkGPUs.
func checkQueued(project string, argv []string, gpus *int, retries int) error {
	if *gpus == 0 {
		*gpus = 1
	}
	if err := checkProject(project); err != nil {
		return err
	}
	if err := checkArgv(argv); err != nil {
		return err
	}
	if retries < 0 || retries > 10 {
		return bad("retries", "%d: want 0 to 10", retries)
	}
	return nil
}

// checkParams checks each parameter's name and that every {name} in
// argv is a parameter. A job's parameters are values, each checked by
// checkValue; a sweep's are specs that Expand checks, so it passes
// value nil.
func checkParams(argv []string, params map[string]string, value func(name, v string) error) error {
	for n, v := range params {
		if value != nil {
			if err := value(n, v); err != nil {
				return err
			}
		}
	}
	for n := range params {
		if !paramName.MatchString(n) {
			return bad("params", "%q is not a parameter name: letters, digits and _, not starting with a digit", n)
		}
	}
	for i, a := range argv {
		for _, m := range placeholder.FindAllStringSubmatch(a, -1) {
			if _, ok := params[m[1]]; !ok {
				return bad("argv", "item %d names {%s}, which is no parameter", i, m[1])
			}
		}
	}
	return nil
}

func checkValue(name, v string) error {
	if v == "" {
		return bad("params", "%s: an empty value", name)
	}
	if len(v) > 4096 {
		return bad("params", "%s: a value is longer than 4096 bytes", name)
	}
	return nil
}

// substitute replaces each {name} in argv by the parameter's value. The
// items stay items: a value with spaces is still one argument, and no
// shell ever reads them.
func substitute(argv []string, params map[string]string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = placeholder.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := params[m[1:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out
}

// ParamEnv is the environment a job's parameters give it: each as
// DEEPSEED_PARAM_<NAME> (upper case), and all as one JSON object in
// DEEPSEED_PARAMS, which the hook sends as the run's params.
func ParamEnv(params map[string]string) []string {
	if len(params) == 0 {
		return nil
	}
	names := make([]string, 0, len(params))
	for n := range params {
		names = append(names, n)
	}
	sort.Strings(names)
	var env []string
	for _, n := range names {
		env = append(env, "DEEPSEED_PARAM_"+strings.ToUpper(n)+"="+params[n])
	}
	// A value that is a JSON number goes as a number ("lr": 0.05), so
	// that the run's params compare and sort as numbers; others as text.
	typed := make(map[string]any, len(params))
	for n, v := range params {
		typed[n] = v
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) && json.Valid([]byte(v)) {
			typed[n] = json.RawMessage(v)
		}
	}
	js, _ := json.Marshal(typed)
	return append(env, "DEEPSEED_PARAMS="+string(js))
}

// rangeSpec is a parameter sampled per trial: "min:max" (uniform),
// "log:min:max" (log-uniform), "int:min:max" (integers, both ends in).
type rangeSpec struct {
	kind     string // "", "log" or "int"
	min, max float64
}

func parseRange(name, v string) (*rangeSpec, error) {
	parts := strings.Split(v, ":")
	r := &rangeSpec{}
	switch {
	case len(parts) == 2:
	case len(parts) == 3 && (parts[0] == "log" || parts[0] == "int"):
		r.kind, parts = parts[0], parts[1:]
	default:
		return nil, bad("params", "%s=%q: a range is min:max, log:min:max or int:min:max", name, v)
	}
	var err1, err2 error
	r.min, err1 = strconv.ParseFloat(strings.TrimSpace(parts[0]), 64)
	r.max, err2 = strconv.ParseFloat(strings.TrimSpace(parts[1]), 64)
	switch {
	case err1 != nil || err2 != nil || math.IsInf(r.min, 0) || math.IsInf(r.max, 0) || math.IsNaN(r.min) || math.IsNaN(r.max):
		return nil, bad("params", "%s=%q: the range's ends must be finite numbers", name, v)
	case r.min > r.max:
		return nil, bad("params", "%s=%q: the range's low end is above its high end", name, v)
	case r.kind == "log" && r.min <= 0:
		return nil, bad("params", "%s=%q: a log range needs ends above 0", name, v)
	case r.kind == "int" && (r.min != math.Trunc(r.min) || r.max != math.Trunc(r.max)):
		return nil, bad("params", "%s=%q: an int range needs whole ends", name, v)
	}
	return r, nil
}

func (r *rangeSpec) sample(rng *rand.Rand) string {
	switch r.kind {
	case "log":
		return strconv.FormatFloat(math.Exp(math.Log(r.min)+rng.Float64()*(math.Log(r.max)-math.Log(r.min))), 'g', 4, 64)
	case "int":
		return strconv.FormatInt(int64(r.min)+rng.Int64N(int64(r.max-r.min)+1), 10)
	}
	return strconv.FormatFloat(r.min+rng.Float64()*(r.max-r.min), 'g', 4, 64)
}

// splitValues splits "a,b,c" into trimmed values, each checked.
func splitValues(name, v string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if err := checkValue(name, s); err != nil {
			return nil, bad("params", "%s=%q: an empty value between commas", name, v)
		}
		out = append(out, s)
	}
	return out, nil
}

// Expand turns a sweep's parameters into one parameter set per trial.
// Without trials it is a grid: comma-separated values sweep, a single
// value stays fixed, and the product may hold at most MaxTrials sets.
// With trials, ranges are sampled (seeded by seed) and comma lists are
// picked from at random, trials times.
func Expand(spec map[string]string, trials int, seed uint64) ([]map[string]string, error) {
	names := make([]string, 0, len(spec))
	for n := range spec {
		names = append(names, n)
	}
	sort.Strings(names)
	if trials < 0 || trials > MaxTrials {
		return nil, bad("trials", "%d: want 1 to %d trials", trials, MaxTrials)
	}
	values := make([][]string, len(names))
	ranges := make([]*rangeSpec, len(names))
	for i, n := range names {
		v := strings.TrimSpace(spec[n])
		if strings.Contains(v, ":") && !strings.Contains(v, ",") && looksLikeRange(v) {
			if trials == 0 {
				return nil, bad("params", "%s=%q is a range: ranges are sampled by random search, give trials", n, v)
			}
			r, err := parseRange(n, v)
			if err != nil {
				return nil, err
			}
			ranges[i] = r
			continue
		}
		vs, err := splitValues(n, v)
		if err != nil {
			return nil, err
		}
		values[i] = vs
	}
	if trials > 0 {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		out := make([]map[string]string, trials)
		for t := range out {
			m := make(map[string]string, len(names))
			for i, n := range names {
				if ranges[i] != nil {
					m[n] = ranges[i].sample(rng)
				} else {
					m[n] = values[i][rng.IntN(len(values[i]))]
				}
			}
			out[t] = m
		}
		return out, nil
	}
	total := 1
	for i, vs := range values {
		total *= len(vs)
		if total > MaxTrials {
			return nil, bad("params", "the grid has more than %d trials (%s and the parameters before it multiply past it): sweep fewer values or use random search with trials", MaxTrials, names[i])
		}
	}
	out := make([]map[string]string, 0, total)
	idx := make([]int, len(names))
	for {
		m := make(map[string]string, len(names))
		for i, n := range names {
			m[n] = values[i][idx[i]]
		}
		out = append(out, m)
		// The last name varies fastest.
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(values[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return out, nil
		}
	}
}

// looksLikeRange tells "1e-5:1e-3" and "log:1e-5:1e-3" from values that
// merely hold a colon, such as "cuda:0" or a URL.
func looksLikeRange(v string) bool {
	parts := strings.Split(v, ":")
	if len(parts) == 3 && (parts[0] == "log" || parts[0] == "int") {
		parts = parts[1:]
	}
	if len(parts) != 2 {
		return false
	}
	for _, p := range parts {
		if _, err := strconv.ParseFloat(strings.TrimSpace(p), 64); err != nil {
			return false
		}
	}
	return true
}
