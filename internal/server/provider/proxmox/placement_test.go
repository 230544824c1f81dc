package proxmox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

func TestChooseNode(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name  string
		nodes []proxmox.NodeLoad
		need  uint64
		want  string
		err   string
	}{
		{name: "fewest members first", want: "b", nodes: []proxmox.NodeLoad{
			{Name: "a", Online: true, FreeMem: 60 * gib, Members: 2},
			{Name: "b", Online: true, FreeMem: 10 * gib, Members: 1},
			{Name: "c", Online: true, FreeMem: 50 * gib, Members: 2}}},
		{name: "then most free memory", want: "c", nodes: []proxmox.NodeLoad{
			{Name: "a", Online: true, FreeMem: 20 * gib, Members: 1},
			{Name: "b", Online: true, FreeMem: 10 * gib, Members: 1},
			{Name: "c", Online: true, FreeMem: 50 * gib, Members: 1}}},
		{name: "then the first name", want: "a", nodes: []proxmox.NodeLoad{
			{Name: "b", Online: true, FreeMem: 20 * gib},
			{Name: "a", Online: true, FreeMem: 20 * gib}}},
		{name: "offline nodes are skipped", want: "b", nodes: []proxmox.NodeLoad{
			{Name: "a", Online: false, FreeMem: 60 * gib},
			{Name: "b", Online: true, FreeMem: 1 * gib, Members: 5}}},
		{name: "a node without room for the VM is skipped", need: 4 * gib, want: "b", nodes: []proxmox.NodeLoad{
			{Name: "a", Online: true, FreeMem: 3 * gib},
			{Name: "b", Online: true, FreeMem: 4 * gib, Members: 3}}},
		{name: "none fits", need: 8 * gib, err: "no node can take a VM of 8192 MiB: a offline, b has 4096 MiB free", nodes: []proxmox.NodeLoad{
			{Name: "a", Online: false, FreeMem: 60 * gib},
			{Name: "b", Online: true, FreeMem: 4 * gib}}},
		{name: "no nodes", err: "no node to place the VM on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := proxmox.ChooseNode(tc.nodes, tc.need)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
