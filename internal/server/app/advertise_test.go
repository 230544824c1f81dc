package app

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
)

func TestWithAdvertiseDefaults(t *testing.T) {
	bind := config.Bind{RegistrationAddr: "0.0.0.0:9002", OperatorAddr: "0.0.0.0:9003", AgentAddr: "0.0.0.0:9004"}
	cases := []struct {
		name  string
		adv   config.Advertise
		bind  config.Bind
		flags []string
		want  config.Advertise
	}{
		{name: "derived from the first host and the bound ports", adv: config.Advertise{Hosts: []string{"127.0.0.1", "10.0.0.1"}}, bind: bind,
			want: config.Advertise{Hosts: []string{"127.0.0.1", "10.0.0.1"}, RegistrationAddr: "127.0.0.1:9002", OperatorAddr: "127.0.0.1:9003", AgentAddr: "127.0.0.1:9004"}},
		{name: "explicit addresses win", adv: config.Advertise{Hosts: []string{"127.0.0.1"}, AgentAddr: "lb.example:443"}, bind: bind,
			want: config.Advertise{Hosts: []string{"127.0.0.1"}, RegistrationAddr: "127.0.0.1:9002", OperatorAddr: "127.0.0.1:9003", AgentAddr: "lb.example:443"}},
		{name: "no hosts, nothing to derive", adv: config.Advertise{}, bind: bind, want: config.Advertise{}},
		{name: "the --advertise-host flags when the config names no host", adv: config.Advertise{}, bind: bind, flags: []string{"10.0.0.9"},
			want: config.Advertise{RegistrationAddr: "10.0.0.9:9002", OperatorAddr: "10.0.0.9:9003", AgentAddr: "10.0.0.9:9004"}},
		{name: "configured hosts win over the flags", adv: config.Advertise{Hosts: []string{"127.0.0.1"}}, bind: bind, flags: []string{"10.0.0.9"},
			want: config.Advertise{Hosts: []string{"127.0.0.1"}, RegistrationAddr: "127.0.0.1:9002", OperatorAddr: "127.0.0.1:9003", AgentAddr: "127.0.0.1:9004"}},
		{name: "kernel-chosen ports are unknown here", adv: config.Advertise{Hosts: []string{"::1"}},
			bind: config.Bind{RegistrationAddr: "127.0.0.1:0", AgentAddr: "[::1]:8994"},
			want: config.Advertise{Hosts: []string{"::1"}, AgentAddr: "[::1]:8994"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{}
			cfg.Shard.Advertise = tc.adv
			got := withAdvertiseDefaults(cfg, tc.bind, tc.flags)
			require.Equal(t, tc.want, got.Shard.Advertise)
			require.Equal(t, tc.adv, cfg.Shard.Advertise, "the loaded config is not changed")
		})
	}
}

// A kernel-chosen port is bound again in the next term; when another socket
// has taken it in between, the next term takes a new one instead of failing
// every term. A configured port stays an error.
func TestListenGRPCRebindsKernelPorts(t *testing.T) {
	a := &App{}
	bind := &config.Bind{RegistrationAddr: "127.0.0.1:0", OperatorAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0"}
	closeAll := func(ls grpcserve.Listeners) {
		for _, l := range []net.Listener{ls.Registration, ls.Operator, ls.Agent} {
			require.NoError(t, l.Close())
		}
	}
	ls, err := a.listenGRPC(bind)
	require.NoError(t, err)
	first := a.Addrs()
	closeAll(ls)

	ls, err = a.listenGRPC(bind)
	require.NoError(t, err)
	require.Equal(t, first, a.Addrs(), "the next term binds the same ports")
	closeAll(ls)

	squatter, err := net.Listen("tcp", first.Operator)
	require.NoError(t, err)
	defer squatter.Close()
	ls, err = a.listenGRPC(bind)
	require.NoError(t, err)
	now := a.Addrs()
	require.NotEqual(t, first.Operator, now.Operator, "a new operator port")
	require.Equal(t, first.Registration, now.Registration)
	require.Equal(t, now.Operator, ls.Operator.Addr().String())
	closeAll(ls)

	fixed := &config.Bind{RegistrationAddr: squatter.Addr().String(), OperatorAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0"}
	_, err = (&App{}).listenGRPC(fixed)
	require.ErrorContains(t, err, "binding registration port "+squatter.Addr().String())
}
