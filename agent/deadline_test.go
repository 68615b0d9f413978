package agent

import "time"

// WaitDeadline bounds every wait of the agent's tests on another process
// (a job, an agent, slurmctld, the server): they poll a condition and
// give up only after it, so a loaded two-core machine slows them down
// without failing them.
const WaitDeadline = 3 * time.Minute
