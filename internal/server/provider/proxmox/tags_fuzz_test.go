package proxmox_test

import (
	"testing"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

// FuzzTagValueRoundTrip: every value (ids come from configs and tenants'
// requests) encodes to a tag Proxmox VE accepts and decodes back to
// itself, and ParseOwner reads it back from the tag.
func FuzzTagValueRoundTrip(f *testing.F) {
	for _, s := range []string{"c1", "Prod_1", "a+b.c-d", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := proxmox.EncodeTagValue(s)
		back, err := proxmox.DecodeTagValue(enc)
		if err != nil || back != s {
			t.Fatalf("%q -> %q -> %q, %v", s, enc, back, err)
		}
		tag := proxmox.Tag(proxmox.TagInstance, s)
		if !proxmox.ValidTag(tag) {
			t.Fatalf("tag of %q is not a Proxmox tag", s)
		}
		if got := proxmox.ParseOwner([]string{tag}).Instance; got != s {
			t.Fatalf("ParseOwner(%q) = %q, want %q", tag, got, s)
		}
	})
}
