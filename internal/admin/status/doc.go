// Package status is nstance-admin's live status page: a Collector keeps a
// snapshot of every shard (the serving leader, config version, groups with
// desired/ready/rotating counts, instances with state, last health report,
// drain deadline and agent version, and the most recent errors) by listing
// over the Operator API whenever a watch stream reports a change, and at a
// fixed interval besides; Handler serves that snapshot as a small HTML page
// (no build step, no external assets), as JSON, and as server-sent events
// that the page follows to update without a reload. The handler does not
// authenticate: `nstance-admin serve` puts it behind adminserve.Handler
// (token, Host, Origin and Content-Type checks).
package status
