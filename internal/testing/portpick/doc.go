// Package portpick gives tests loopback ports for servers that must be told
// their address before they bind it (a child process's flags, the address
// an instance's agent is started with).
//
// Picking a port with net.Listen(":0") and closing it races with the rest of
// the machine: the kernel hands the same ephemeral port to the next
// listener or outgoing connection, which may then hold it for the whole
// test. portpick instead picks from outside the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), which the kernel never assigns
// by itself, and holds an advisory lock on the port (a flock on a file
// under the temporary directory) until the test ends, so concurrent tests,
// in this process or another, never pick the same one.
package portpick
