package proxmox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

func TestTagValueEncoding(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"c1", "c1"},
		{"web-0a1b2c3d", "web-0a1b2c3d"},
		{"us-west.2a", "us-west.2a"},
		{"Prod", "+prod"},
		{"a_b", "a_5fb"},
		{"a+b", "a_2bb"},
		{"", ""},
		{"Ünï", "_c3_9cn_c3_af"},
	} {
		got := proxmox.EncodeTagValue(tc.in)
		require.Equal(t, tc.want, got, "encode %q", tc.in)
		back, err := proxmox.DecodeTagValue(got)
		require.NoError(t, err)
		require.Equal(t, tc.in, back)
		if tc.in != "" {
			require.True(t, proxmox.ValidTag(proxmox.Tag(proxmox.TagCluster, tc.in)), "tag of %q", tc.in)
		}
	}
	for _, bad := range []string{"+", "+1", "_", "_4", "_zz", "_4F", "A", "a/b", "a b"} {
		_, err := proxmox.DecodeTagValue(bad)
		require.Error(t, err, "decode %q", bad)
	}
}

func TestOwnerTags(t *testing.T) {
	o := proxmox.Owner{Cluster: "Prod", Shard: "s1", Tenant: "acme", Group: "web", Template: "worker", Instance: "web-0a1b2c3d"}
	tags := proxmox.OwnerTags(o, []string{"k8s", "K8s", "team-a"})
	require.Equal(t, []string{"k8s", "nstance-cluster.+prod", "nstance-group.web", "nstance-instance.web-0a1b2c3d", "nstance-shard.s1",
		"nstance-template.worker", "nstance-tenant.acme", "team-a"}, tags)
	require.Equal(t, o, proxmox.ParseOwner(tags))
	// Proxmox may hand tags back in another case and order; undecodable
	// ones and others are ignored.
	require.Equal(t, proxmox.Owner{Cluster: "c1", Instance: "x"},
		proxmox.ParseOwner([]string{"NSTANCE-INSTANCE.x", "nstance-cluster.c1", "nstance-shard._zz", "nstance-other.y", "nstance-group"}))
	require.Equal(t, []string{"a", "b", "c", "d"}, proxmox.SplitTags("a;b,c d"))
}
