package agent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	if got := readTail(path, 10, 0); got != "" {
		t.Errorf("missing file: %q", got)
	}
	if err := os.WriteFile(path, []byte("abc€def"), 0o644); err != nil { // € is 3 bytes
		t.Fatal(err)
	}
	for n, want := range map[int]string{
		5:   "def", // cut inside €: starts at the next whole character
		6:   "€def",
		100: "abc€def",
	} {
		if got := readTail(path, n, 0); got != want {
			t.Errorf("tail %d: %q, want %q", n, got, want)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != "abc€def" {
		t.Errorf("a read without a bound changed the file: %q", b)
	}
}

// TestReadTailCutsBack holds the bound on an output file: past keep
// bytes the file is cut back to the tail, and a job appending to it
// writes after that tail.
func TestReadTailCutsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	if err := os.WriteFile(path, []byte("0123456789\xffabcdef"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readTail(path, 8, 100); got != "9?abcdef" {
		t.Errorf("under the bound: %q, want 9?abcdef (invalid UTF-8 as ?)", got)
	}
	if b, _ := os.ReadFile(path); len(b) != 17 {
		t.Errorf("under the bound the file was changed: %q", b)
	}
	if got := readTail(path, 6, 16); got != "abcdef" {
		t.Errorf("over the bound: %q", got)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("gh"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "abcdefgh" {
		t.Errorf("after the cut and an append the file holds %q, want abcdefgh", b)
	}
}
