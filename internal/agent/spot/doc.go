// Package spot watches the EC2 instance metadata service for a spot
// interruption notice. It polls spot/instance-action through the SDK's IMDS
// client, which speaks IMDSv2 (a session token from PUT /latest/api/token
// sent with every read). The path answers 404 until EC2 schedules the
// interruption, then {"action": "terminate"|"stop"|"hibernate", "time":
// RFC 3339}; the watcher turns that into a TERMINATION_KIND_SPOT notice the
// agent carries in every health report from then on, and the shard leader
// replaces the instance first.
//
// The Watcher reads a Source: IMDS on EC2, GCP (the metadata server's
// instance/preempted) on Google Cloud.
package spot
