// Package aws is the EC2 provider (kind "aws"): every instance is one EC2
// instance launched with RunInstances from a launch template or an AMI, an
// instance type and a subnet of the instance's subnet pool (a shard is one
// zone, so a pool lists that zone's subnets). The instance id is the client
// token, so a repeated create returns the instance the first one launched;
// ownership tags (nstance.dev/cluster, shard, tenant, group, instance-id,
// provider-id) find instances again for Status, List and Delete. The agent's
// nonce, CA bundle and server addresses reach the machine through a
// cloud-init compatible user-data script (see UserData).
//
// The provider talks to EC2 only through EC2API, the few client methods it
// calls (ec2.Client satisfies it; the fake sub-package is a stateful
// in-process EC2 for tests; IAMActions derives the IAM action list). The SDK
// client retries throttling and transient errors (adaptive retry mode); what
// the SDK cannot know — an instance not yet visible to DescribeInstances just
// after RunInstances, an ENI still detaching — is waited for with an
// apimachinery wait.Backoff.
//
// ENI holds the shard's fixed network interface for the leader: Acquire
// force-detaches it from a previous holder and attaches it to this server's
// instance; Release gives it up on step-down.
package aws
