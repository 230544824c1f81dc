// Package msgsize is the gRPC message size every nstance client (agent,
// operator, admin) accepts. Servers are configured with
// shard.limits.max_message_bytes, which config validation keeps at or below
// ClientMax, so a message a server may send is never too large for a client.
package msgsize

import "google.golang.org/grpc"

// ClientMax is the largest message an nstance client receives or sends
// (gRPC's own default is 4 MiB).
const ClientMax = 64 << 20

// DialOption raises a client connection's per-call limits to ClientMax.
func DialOption() grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(ClientMax), grpc.MaxCallSendMsgSize(ClientMax))
}
