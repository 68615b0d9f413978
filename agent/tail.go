package agent

import (
	"errors"
	"io"
	"os"
	"strings"
	"unicode/utf8"
)

// readTail returns the last n bytes of the output file at path, starting
// at a whole UTF-8 character, with any other invalid UTF-8 written as
// '?'; "" when there is no such file yet. When keep is above 0 and the
// file has grown past it, the file is cut back to the tail returned: a
// job writes its output with O_APPEND, so its next write lands after the
// kept tail. Both executors report their jobs' output through it.
func readTail(path string, n int, keep int64) string {
	if path == "" {
		return ""
	}
	mode := os.O_RDONLY
	if keep > 0 {
		mode = os.O_RDWR
	}
	f, err := os.OpenFile(path, mode, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	size := fi.Size()
	off := max(size-int64(n), 0)
	b := make([]byte, size-off)
	k, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	b = b[:k]
	if keep > 0 && size > keep {
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt(b, 0)
		}
	}
	if off > 0 {
		for k := 0; k < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); k++ {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "?")
}
