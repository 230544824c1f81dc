// Package cloudinit builds the user data that bootstraps the agent on a
// cloud-init machine, shared by the providers of real machines (aws,
// proxmox): AgentScript is the "#!" script that writes the agent's nonce,
// CA bundle and settings and starts it; Compose puts the instance's own
// bootstrap data beside it as a multi-part MIME document, never instead
// of it.
package cloudinit
