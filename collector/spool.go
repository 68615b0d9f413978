package collector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
// survives restarts. Batches are of two sources: the hook's records, which
// were acknowledged to their sender once written and are never deleted
// before the server has them, and the collector's own samples, which
// nobody would send again and which make room for newer ones past
// maxBytes.
type spool struct {
	dir      string
	maxBytes int64
	onDrop   func(records int)
	now      func() time.Time

	mu      sync.Mutex
	files   []spoolFile // oldest first
	bytes   int64       // of the files, and of writes under way
	records int         // of the files
	sampled int         // records of sampled batches among them

	writes atomic.Int64 // batches written, for the benchmarks
}

type spoolFile struct {
	seq     uint64
	n       int
	size    int64
	sampled bool      // the collector's own samples: may make room
	at      time.Time // when it was written (acknowledged, for the hook's)
	sending bool      // taken by the send loop: not dropped meanwhile
}

const (
	spoolExt = ".ndjson"
	// sampleTag marks the files of sampled batches; files without it
	// (those of earlier versions too) hold acknowledged records.
	sampleTag = ".s"
)

func openSpool(dir string, maxBytes int64, onDrop func(int)) (*spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &spool{dir: dir, maxBytes: maxBytes, onDrop: onDrop, now: time.Now}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			// A write cut short by a crash: the batch was never acknowledged
			// to anyone but the in-memory queue, which is gone.
			os.Remove(filepath.Join(dir, name))
			continue
		}
		seq, n, sampled, ok := parseSpoolName(name)
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		s.files = append(s.files, spoolFile{seq: seq, n: n, size: info.Size(), sampled: sampled, at: info.ModTime()})
		s.bytes += info.Size()
		s.records += n
		if sampled {
			s.sampled += n
		}
	}
	sort.Slice(s.files, func(i, j int) bool { return s.files[i].seq < s.files[j].seq })
	return s, nil
}

func spoolName(seq uint64, n int, sampled bool) string {
	if sampled {
		return fmt.Sprintf("%020d-%d%s%s", seq, n, sampleTag, spoolExt)
	}
	return fmt.Sprintf("%020d-%d%s", seq, n, spoolExt)
}

func (f spoolFile) name() string { return spoolName(f.seq, f.n, f.sampled) }

func parseSpoolName(name string) (seq uint64, n int, sampled bool, ok bool) {
	base, found := strings.CutSuffix(name, spoolExt)
	if !found {
		return 0, 0, false, false
	}
	base, sampled = strings.CutSuffix(base, sampleTag)
	a, b, found := strings.Cut(base, "-")
	if !found {
		return 0, 0, false, false
	}
	seq, err1 := strconv.ParseUint(a, 10, 64)
	n, err2 := strconv.Atoi(b)
	return seq, n, sampled, err1 == nil && err2 == nil
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

// add writes a batch of the collector's own samples durably, making room
// past the bound by dropping the oldest sampled batches: the newest
// samples are worth more than the oldest. It never drops the hook's
// acknowledged records: when they alone fill the spool, b is not written
// and add answers errSpoolFull.
func (s *spool) add(b *batch) error { return s.write(b, true) }

// addFitting writes a batch of the hook's records durably if it fits
// within the bound once sampled batches made room, and otherwise answers
// errSpoolFull and writes nothing: the hook still holds them and sends
// them again.
func (s *spool) addFitting(b *batch) error { return s.write(b, false) }

// write puts b in the spool so that it survives a crash of the process
// or of the machine once write returns: the data is written to a temporary
// file and synced, renamed to its final name, and the directory synced so
// that the name is on disk too. A crash before the rename leaves only the
// temporary file, which openSpool removes: such a batch was never
// acknowledged. Room is made and reserved before the write, so that two
// writes at once cannot take the spool past its bound together.
func (s *spool) write(b *batch, sampled bool) error {
	size := int64(len(b.Body))
	s.mu.Lock()
	dropped, ok := s.makeRoomLocked(size)
	if ok {
		s.bytes += size
	}
	s.mu.Unlock()
	if dropped > 0 && s.onDrop != nil {
		s.onDrop(dropped)
	}
	if !ok {
		return errSpoolFull
	}
	f := spoolFile{seq: b.Seq, n: b.N, size: size, sampled: sampled}
	name := filepath.Join(s.dir, f.name())
	err := writeFileDurably(s.dir, name, b.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.bytes -= size
		return fmt.Errorf("spool: write: %w", err)
	}
	s.writes.Add(1)
	f.at = s.now()
	// Insert in sequence order, whatever order batches were written in.
	i := sort.Search(len(s.files), func(i int) bool { return s.files[i].seq >= b.Seq })
	s.files = slices.Insert(s.files, i, f)
	s.records += f.n
	if f.sampled {
		s.sampled += f.n
	}
	return nil
}

// makeRoomLocked drops the oldest sampled batches not being sent until
// size more bytes fit within the bound, and reports whether they do. It
// drops nothing when even dropping every such batch would not be enough.
func (s *spool) makeRoomLocked(size int64) (dropped int, ok bool) {
	if s.maxBytes <= 0 || s.bytes+size <= s.maxBytes {
		return 0, true
	}
	var droppable int64
	for _, f := range s.files {
		if f.sampled && !f.sending {
			droppable += f.size
		}
	}
	if s.bytes-droppable+size > s.maxBytes {
		return 0, false
	}
	kept := s.files[:0]
	for _, f := range s.files {
		if s.bytes+size > s.maxBytes && f.sampled && !f.sending {
			os.Remove(filepath.Join(s.dir, f.name()))
			s.forgetLocked(f)
			dropped += f.n
			continue
		}
		kept = append(kept, f)
	}
	clear(s.files[len(kept):])
	s.files = kept
	return dropped, true
}

// forgetLocked takes f out of the totals.
func (s *spool) forgetLocked(f spoolFile) {
	s.bytes -= f.size
	s.records -= f.n
	if f.sampled {
		s.sampled -= f.n
	}
}

// writeFileDurably writes data to name through a synced temporary file,
// renamed, and the directory synced.
func writeFileDurably(dir, name string, data []byte) error {
	tmp := name + ".tmp"
	if err := writeSynced(tmp, data); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
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

// take reads the oldest spooled batches, at least one and then as many
// as fit in maxBytes and maxRecords together, as one batch for one send,
// and marks them as being sent; it returns nil when the spool is empty.
// The batch's Seq is its first file's; seqs lists them all for settle.
// A file that cannot be read is dropped and counted.
func (s *spool) take(maxBytes, maxRecords int, buf []byte) (b *batch, seqs []uint64) {
	s.mu.Lock()
	var files []spoolFile
	var size int64
	n := 0
	for i := range s.files {
		f := &s.files[i]
		if f.sending {
			continue
		}
		if len(files) > 0 && (size+f.size > int64(maxBytes) || n+f.n > maxRecords) {
			break
		}
		f.sending = true
		files = append(files, *f)
		size += f.size
		n += f.n
	}
	s.mu.Unlock()
	if len(files) == 0 {
		return nil, nil
	}
	b = &batch{Seq: files[0].seq, Body: buf[:0]}
	for _, f := range files {
		body, err := os.ReadFile(filepath.Join(s.dir, f.name()))
		if err != nil {
			if s.remove(f.seq) && s.onDrop != nil {
				s.onDrop(f.n)
			}
			continue
		}
		b.Body = append(b.Body, body...)
		b.N += f.n
		seqs = append(seqs, f.seq)
	}
	if len(seqs) == 0 {
		return s.take(maxBytes, maxRecords, buf)
	}
	return b, seqs
}

// release hands batches taken for a send that failed back to the spool.
func (s *spool) release(seqs []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, seq := range seqs {
		if i, ok := s.indexLocked(seq); ok {
			s.files[i].sending = false
		}
	}
}

// oldest reads the oldest spooled batch, or returns nil when the spool is
// empty.
func (s *spool) oldest() *batch {
	b, seqs := s.take(0, 0, nil)
	if b != nil {
		s.release(seqs)
	}
	return b
}

func (s *spool) indexLocked(seq uint64) (int, bool) {
	i := sort.Search(len(s.files), func(i int) bool { return s.files[i].seq >= seq })
	return i, i < len(s.files) && s.files[i].seq == seq
}

// remove deletes the batch seq; it reports whether it was there.
func (s *spool) remove(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.indexLocked(seq)
	if !ok {
		return false
	}
	f := s.files[i]
	os.Remove(filepath.Join(s.dir, f.name()))
	s.forgetLocked(f)
	if i == 0 {
		s.files[0] = spoolFile{}
		s.files = s.files[1:]
	} else {
		s.files = slices.Delete(s.files, i, i+1)
	}
	return true
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

// counts returns the records spooled: all of them, and those of the
// collector's own samples.
func (s *spool) counts() (records, sampled int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records, s.sampled
}

// oldestHook is when the oldest spooled batch of the hook's records was
// acknowledged; ok is false when there is none.
func (s *spool) oldestHook() (t time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		if !f.sampled {
			return f.at, true
		}
	}
	return time.Time{}, false
}
