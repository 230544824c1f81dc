package attack

// onDemandCases are the cases of issue 29 about on-demand pods: namespaces, pool opt-in, instance types, count (finding 5).
func onDemandCases() []attackCase {
	return nil
}
