package collector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// batch is a run of NDJSON records that is sent, spooled and acknowledged
// as one. Seq orders batches across restarts.
type batch struct {
	Seq  uint64
	N    int    // records
	Body []byte // NDJSON, one record per line
	// pooled is set on bodies from batchBufs, which release returns.
	pooled bool
}

// spool is a bounded directory of batches, one file per batch, named by
// sequence number so that a directory listing is the send order. It
// survives restarts; past maxBytes the oldest batches are dropped.
type spool struct {
	dir      string
	maxBytes int64
	onDrop   func(records int)

	mu    sync.Mutex
	files []spoolFile // oldest first
	bytes int64

	writes atomic.Int64 // batches written, for the benchmarks
}

type spoolFile struct {
	seq  uint64
	n    int
	size int64
}

const spoolExt = ".ndjson"

func openSpool(dir string, maxBytes int64, onDrop func(int)) (*spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &spool{dir: dir, maxBytes: maxBytes, onDrop: onDrop}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			// A write cut short by a crash: the batch was never acknowledged
			// to anyone but the in-memory queue, which is gone.
			os.Remove(filepath.Join(dir, name))
			continue
		}
		seq, n, ok := parseSpoolName(name)
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		s.files = append(s.files, spoolFile{seq: seq, n: n, size: info.Size()})
		s.bytes += info.Size()
	}
	sort.Slice(s.files, func(i, j int) bool { return s.files[i].seq < s.files[j].seq })
	return s, nil
}

func spoolName(seq uint64, n int) string {
	return fmt.Sprintf("%020d-%d%s", seq, n, spoolExt)
}

func parseSpoolName(name string) (seq uint64, n int, ok bool) {
	base, found := strings.CutSuffix(name, spoolExt)
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(base, "-")
	if !found {
		return 0, 0, false
	}
	seq, err1 := strconv.ParseUint(a, 10, 64)
	n, err2 := strconv.Atoi(b)
	return seq, n, err1 == nil && err2 == nil
}

// nextSeq is one past the newest spooled batch.
func (s *spool) nextSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.files) == 0 {
		return 1
	}
	return s.files[len(s.files)-1].seq + 1
}

// errSpoolFull says a batch would take the spool past its bound.
var errSpoolFull = errors.New("spool full")

// add writes b durably and then drops the oldest batches while the spool is
// over its bound. It is for the collector's own samples, which nobody
// would send again: the newest are worth more than the oldest.
func (s *spool) add(b *batch) error { return s.write(b, false) }

// addFitting writes b durably if it fits within the bound, and otherwise
// answers errSpoolFull and writes nothing: for records a sender still
// holds and will send again.
func (s *spool) addFitting(b *batch) error { return s.write(b, true) }

// write puts b in the spool so that it survives a crash of the process
// or of the machine once write returns: the data is written to a temporary
// file and synced, renamed to its final name, and the directory synced so
// that the name is on disk too. A crash before the rename leaves only the
// temporary file, which openSpool removes: such a batch was never
// acknowledged.
func (s *spool) write(b *batch, mustFit bool) error {
	size := int64(len(b.Body))
	if mustFit {
		s.mu.Lock()
		full := s.maxBytes > 0 && s.bytes+size > s.maxBytes
		s.mu.Unlock()
		if full {
			return errSpoolFull
		}
	}
	name := filepath.Join(s.dir, spoolName(b.Seq, b.N))
	tmp := name + ".tmp"
	if err := writeSynced(tmp, b.Body); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("spool: write: %w", err)
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("spool: write: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("spool: write: %w", err)
	}
	s.writes.Add(1)
	s.mu.Lock()
	f := spoolFile{seq: b.Seq, n: b.N, size: size}
	// Insert in sequence order, whatever order batches were written in.
	i := sort.Search(len(s.files), func(i int) bool { return s.files[i].seq >= b.Seq })
	if i < len(s.files) && s.files[i].seq == b.Seq {
		s.bytes -= s.files[i].size
		s.files[i] = f
	} else {
		s.files = append(s.files, spoolFile{})
		copy(s.files[i+1:], s.files[i:])
		s.files[i] = f
	}
	s.bytes += f.size
	var dropped int
	for s.maxBytes > 0 && s.bytes > s.maxBytes && len(s.files) > 1 {
		old := s.files[0]
		s.files = s.files[1:]
		s.bytes -= old.size
		os.Remove(filepath.Join(s.dir, spoolName(old.seq, old.n)))
		dropped += old.n
	}
	s.mu.Unlock()
	if dropped > 0 && s.onDrop != nil {
		s.onDrop(dropped)
	}
	return nil
}

// writeSynced writes data to a new file and syncs it before closing.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if !noSync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// syncDir syncs a directory, so that the names created or renamed in it
// survive a crash of the machine.
func syncDir(dir string) error {
	if noSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// noSync turns the syncs off; only the durability benchmark sets it, to
// measure what they cost.
var noSync bool

// oldest reads the oldest spooled batch, or returns nil when the spool is
// empty. A file that cannot be read is dropped and counted.
func (s *spool) oldest() *batch {
	for {
		s.mu.Lock()
		if len(s.files) == 0 {
			s.mu.Unlock()
			return nil
		}
		f := s.files[0]
		s.mu.Unlock()
		body, err := os.ReadFile(filepath.Join(s.dir, spoolName(f.seq, f.n)))
		if err == nil {
			return &batch{Seq: f.seq, N: f.n, Body: body}
		}
		if s.remove(f.seq) && s.onDrop != nil {
			s.onDrop(f.n)
		}
	}
}

// remove deletes the batch seq; it reports whether it was there.
func (s *spool) remove(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.files {
		if f.seq == seq {
			os.Remove(filepath.Join(s.dir, spoolName(f.seq, f.n)))
			s.files = append(s.files[:i], s.files[i+1:]...)
			s.bytes -= f.size
			return true
		}
	}
	return false
}

func (s *spool) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.files)
}

func (s *spool) size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

func (s *spool) records() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.files {
		n += f.n
	}
	return n
}
