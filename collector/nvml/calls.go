package nvml

// call names one NVML call that Read makes: its position in the call
// table, [nvmlCalls] (real.go), so that each call has its own id by being
// a row of its own. [Real] times each under its name when recording
// costs, and remembers per device the ones it answered as unsupported so
// it never makes them again; [Fake] replays the recorded cost of the
// calls Real would have made for the same fields.
type call uint8

// numCalls is the number of calls in the table.
const numCalls = call(len(nvmlCalls))

// callNames are the calls' names, by id, as cost records and captures
// name them (and the metric table's NVMLCall).
var callNames [numCalls]string

// callID maps a call's name to its id.
var callID = map[string]call{}

func init() {
	if numCalls > 32 {
		panic("nvml: more calls than a callSet holds")
	}
	for c := range nvmlCalls {
		name := nvmlCalls[c].name
		if _, dup := callID[name]; dup {
			panic("nvml: two calls named " + name + ": each NVML call needs its own row, or a refusal of one turns the other off")
		}
		callNames[c] = name
		callID[name] = call(c)
	}
}

// callSet is a set of calls, one bit each.
type callSet uint32

func (s callSet) has(c call) bool { return s&(1<<c) != 0 }
func (s *callSet) add(c call)     { *s |= 1 << c }
