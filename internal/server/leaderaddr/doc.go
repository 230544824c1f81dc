// Package leaderaddr gives the shard leader the shard's fixed address: the
// address agents and operators dial, held by exactly the server that leads
// and by no standby.
//
// A Holder is acquired after the server wins its shard election and before
// it serves gRPC, and released when it steps down or shuts down. Two modes
// live here: None (no fixed address; clients dial every server) and VIP (a
// Linux address added to an interface, announced with gratuitous ARP). The
// AWS network-interface mode implements the same interface in the AWS
// provider package.
//
// A VIP is added with a kernel address lifetime that ends no later than the
// leader's lease validity (Until) and is refreshed while it leads: a server
// that is killed, frozen or partitioned loses the address on its own when
// its lease validity runs out, before a standby may take over, even though
// nothing ran its Release.
package leaderaddr
