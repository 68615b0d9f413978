package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Closing GPU minutes (migration 0018). A GPU's minute rollups are
// written once the minute is over, from its samples, instead of with each
// batch of them: gpu_minute_marks holds, for each GPU, the first minute
// its rows do not hold yet (closed_until). Ingest adds a sample to its
// minute's row only below the mark (a sample that came late); readers take
// the minutes from the mark on from the samples (gpuMinuteUnion). The
// refresher moves the marks on (CloseGPUMinutes), a host at a time, under
// the host's GPU minute lock held exclusively, which every batch of the
// host's samples holds shared: no batch of the host is in flight while its
// minutes are summed from the samples and its marks moved, so each row
// holds every sample of its minute.

// closeGrace is how long after a minute ends it is closed: the samples of
// its last seconds come in the next batch or two of their collector.
const closeGrace = time.Minute

// closeLimit is the minute up to which GPU k's minutes may close, as lim
// (with $1 closeGrace in seconds): closeGrace before the server's clock,
// and no later than the minute of the GPU's newest sample, which stays
// open until a sample of a later minute comes. Samples loaded in bulk, or
// sent again from a collector's spool, thus close behind the newest ones
// as live ones do, rather than all at once with each later batch adding
// to rows already written; a GPU that stopped keeps its last minute open,
// read from its samples.
const closeLimit = `SELECT least(date_trunc('minute', now()) - make_interval(secs => $1), date_trunc('minute', max(s.time))) AS lim
	FROM gpu_samples s WHERE s.host = k.host AND s.gpu = k.gpu`

// closeSamples bounds the samples one GPU's closing reads: its mark moves
// up to the minute of its closeSamples-th sample past the mark at most.
const closeSamples = 10000

// closeHosts is how many hosts one call closes at most.
const closeHosts = 100

// CloseGPUMinutes closes the minutes of up to closeHosts hosts whose GPUs
// have samples in minutes that ended closeGrace ago or more and are not
// closed yet, the longest waiting first (none on a standby: its primary
// closes them). It returns how many hosts it closed and whether more may
// wait (it closed some).
func (s *Store) CloseGPUMinutes(ctx context.Context) (hosts int, more bool, err error) {
	rows, err := s.pool.Query(ctx, `
		SELECT k.host FROM gpu_minute_marks k, LATERAL (`+closeLimit+`) l
		WHERE NOT pg_is_in_recovery() AND k.closed_until < l.lim
		  AND EXISTS (SELECT 1 FROM gpu_samples s WHERE s.host = k.host AND s.gpu = k.gpu
		              AND s.time >= k.closed_until AND s.time < l.lim)
		GROUP BY k.host ORDER BY min(k.closed_until), k.host LIMIT $2`, closeGrace.Seconds(), closeHosts)
	if err != nil {
		return 0, false, fmt.Errorf("store: find GPU minutes to close: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, false, fmt.Errorf("store: find GPU minutes to close: %w", err)
	}
	for _, h := range names {
		if err := s.closeHostMinutes(ctx, h); err != nil {
			return hosts, true, err
		}
		hosts++
	}
	// A GPU closes closeSamples samples at a time, and other hosts may
	// wait: whoever closed something calls again.
	return hosts, hosts > 0, nil
}

// closeHostMinutes closes the minutes of host's GPUs up to closeGrace
// ago, closeSamples samples a GPU at most, in one transaction under the
// host's GPU minute lock.
func (s *Store) closeHostMinutes(ctx context.Context, host string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: %w", host, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($2), pg_advisory_xact_lock($1)`,
		gpuHostLockKey(host), wideBatchLock); err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: lock: %w", host, err)
	}
	// Read after the lock: the marks as the last closing left them. Each
	// GPU closes up to the limit, or to the minute of its closeSamples-th
	// sample past its mark (a minute more than its mark at least).
	rows, err := tx.Query(ctx, `
		SELECT k.gpu, k.closed_until,
		       greatest(k.closed_until + interval '1 minute', least(l.lim, coalesce(date_trunc('minute', n.time), l.lim)))
		FROM gpu_minute_marks k
		CROSS JOIN LATERAL (`+closeLimit+`) l
		LEFT JOIN LATERAL (SELECT s.time FROM gpu_samples s WHERE s.host = k.host AND s.gpu = k.gpu AND s.time >= k.closed_until
		                   ORDER BY s.time OFFSET $3 LIMIT 1) n ON true
		WHERE k.host = $2 AND k.closed_until < l.lim
		ORDER BY k.gpu`, closeGrace.Seconds(), host, closeSamples)
	if err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: read marks: %w", host, err)
	}
	var gpus []int32
	var los, his []time.Time
	var g int32
	var lo, hi time.Time
	if _, err := pgx.ForEachRow(rows, []any{&g, &lo, &hi}, func() error {
		gpus, los, his = append(gpus, g), append(los, lo), append(his, hi)
		return nil
	}); err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: read marks: %w", host, err)
	}
	if len(gpus) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, closeGPUMinutes, host, gpus, los, his); err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: %w", host, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE gpu_minute_marks k SET closed_until = w.hi
		FROM unnest($2::int[], $3::timestamptz[]) AS w(gpu, hi) WHERE k.host = $1 AND k.gpu = w.gpu`, host, gpus, his); err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: move marks: %w", host, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: close GPU minutes of %s: commit: %w", host, err)
	}
	return nil
}
