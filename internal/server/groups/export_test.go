package groups

// QueuedChanges is how many changes wait for the tenant's next write.
func QueuedChanges(r *Registry, tenant string) int {
	r.queueMu.Lock()
	defer r.queueMu.Unlock()
	return len(r.queued[tenant])
}
