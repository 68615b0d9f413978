package plugin

import (
	"testing"

	"github.com/deepseed/deepseed/api"
)

// TestCompareTellsEqualNamesApart: a configuration recorded twice is two
// rows and two bars of one name; the Run column adds each one's short id,
// and leaves a name of its own as it is.
func TestCompareTellsEqualNamesApart(t *testing.T) {
	f := compareFrame(api.CompareResponse{Rows: []api.CompareRow{
		{RunID: "seed003-zero2-8f3a91c2", Name: "ZeRO-2 BF16"},
		{RunID: "seed003-zero2-d41e07b9", Name: "ZeRO-2 BF16"},
		{RunID: "ddp", Name: "DDP"},
	}})
	var got []string
	for _, fl := range f.Fields {
		if fl.Name == "name" {
			for i := range fl.Len() {
				got = append(got, fl.At(i).(string))
			}
		}
	}
	want := []string{"ZeRO-2 BF16 · …8f3a91c2", "ZeRO-2 BF16 · …d41e07b9", "DDP"}
	if len(got) != len(want) {
		t.Fatalf("runs %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("run %d: %q, want %q", i, got[i], want[i])
		}
	}
}
