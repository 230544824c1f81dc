package config

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary documents to Parse, the parser of the shard
// config each server reads from the bucket (config/<shard>.jsonc). Parse must
// never panic and must return exactly one of a config and an error. A config
// it accepts must pass Validate again unchanged and survive a round trip:
// encoded as JSON and parsed again, it yields the same config (defaults are
// idempotent, and nothing accepted is lost or altered on the way).
func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	for _, p := range []string{"../../examples/config-tmux.jsonc", "../../examples/config-aws.jsonc", "../../examples/config-gcp.jsonc"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, r := range [][2]string{
		{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "leader_election": {"lease_duration": "2s", "renew_interval": "1s", "max_clock_skew": "100ms"}}`},
		{`"zone": "deva"}`, `"zone": "deva"}, "leader_address": {"mode": "vip", "interface": "eth0", "address": "10.0.0.10/24"}`},
		{`"zone": "deva"}`, `"zone": "deva"}, "registration": {"source_address_check": "off", "trusted_proxies": ["10.0.0.0/8", "192.168.1.1"]}`},
		{`"kind": "worker"}`, `"kind": "worker", "files": {"f": {"kind": "string", "path": "etc/app.conf", "content": "x={{ .Vars.x }}"}}, "keys": {"k": {"type": "ed25519"}}}`},
		{`"cluster": {"id": "c1"}`, `"cluster": {"id": "c1", "secrets": {"encryption_key": {"provider": "aws-ssm", "parameter": "/k"}, "previous_keys": [{"provider": "file", "path": "/k"}]}}`},
		{`"size": 2`, `"size": 1e400`},
		{`"size": 2`, `"size": -0.5`},
		{`"id": "c1"`, `"id": "\u0000"`},
	} {
		f.Add([]byte(strings.Replace(minimal, r[0], r[1], 1)))
	}
	f.Add([]byte(`{"cluster": {"id": "c1"}, "shard": /* */ {"id": "s1",},}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"templates": {"t": {"files": {"f": {"kind": "string", "path": "../x"}}}}}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v: want exactly one", cfg != nil, err)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("Parse returned an empty error message")
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("an accepted config fails Validate: %v", err)
		}
		enc, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("an accepted config cannot be encoded: %v", err)
		}
		again, err := Parse(enc)
		if err != nil {
			t.Fatalf("an accepted config, encoded as JSON, is refused: %v\n%s", err, enc)
		}
		if !reflect.DeepEqual(cfg, again) {
			enc2, _ := json.Marshal(again)
			t.Fatalf("an accepted config changes in a round trip:\n%s\n%s", enc, enc2)
		}
	})
}
