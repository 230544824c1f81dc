package proxmox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

func TestOptionsValidation(t *testing.T) {
	good := map[string]any{"endpoint": "https://pve1:8006/api2/json", "token_id": "nstance@pve!server", "nodes": []any{"pve1", "pve2"},
		"template_vmid": float64(9000)}
	for _, tc := range []struct {
		name string
		edit func(o map[string]any)
		args map[string]string
		want []string
	}{
		{name: "valid"},
		{name: "required", edit: func(o map[string]any) {
			delete(o, "endpoint")
			delete(o, "token_id")
			delete(o, "nodes")
			delete(o, "template_vmid")
		},
			want: []string{"shard.infra.options.endpoint", "shard.infra.options.nodes", "shard.infra.options.token_id", "templates.worker.args"}},
		{name: "bad values", edit: func(o map[string]any) {
			o["token_id"] = "nstance@pve"
			o["nodes"] = []any{"pve1", "pve1", "pve_2"}
			o["node_templates"] = map[string]any{"pve9": float64(9001), "pve1": float64(5)}
			o["cloudinit_device"] = "ide7"
			o["cloudinit_storage"] = "local:iso"
			o["tags"] = []any{"OK", "nstance-cluster.x", "-x"}
			o["agent"] = map[string]any{"state_dir": "relative"}
			o["task_timeout"] = "0s"
		}, want: []string{"shard.infra.options.agent.state_dir", "shard.infra.options.cloudinit_device", "shard.infra.options.cloudinit_storage",
			"shard.infra.options.node_templates.pve1", "shard.infra.options.node_templates.pve9", "shard.infra.options.nodes[1]", "shard.infra.options.nodes[2]",
			"shard.infra.options.tags[0]", "shard.infra.options.tags[1]", "shard.infra.options.tags[2]", "shard.infra.options.task_timeout",
			"shard.infra.options.token_id"}},
		{name: "template args", args: map[string]string{proxmox.ArgTemplateVMID: "abc", proxmox.ArgPool: "a/b"},
			want: []string{"templates.worker.args"}},
		{name: "image arg is a VMID", args: map[string]string{provider.ArgImage: "ami-1"}, want: []string{"templates.worker.args"}},
		{name: "a template per template", edit: func(o map[string]any) { delete(o, "template_vmid") },
			args: map[string]string{proxmox.ArgTemplateVMID: "9001"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			o := map[string]any{}
			for k, v := range good {
				o[k] = v
			}
			if tc.edit != nil {
				tc.edit(o)
			}
			cfg.Shard.Infra.Provider, cfg.Shard.Infra.Options = proxmox.KindName, o
			w := cfg.Templates["worker"]
			w.Args = tc.args
			cfg.Templates["worker"] = w
			errs := provider.NewRegistry(proxmox.Kind()).Check(cfg)
			var keys []string
			for _, e := range errs {
				keys = append(keys, e.Key)
			}
			require.Equal(t, tc.want, keys, "%v", errs)
		})
	}
}
