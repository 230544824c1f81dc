package attack

// tenancyCases are the cases of issue 29 about templates per tenant and a workload CA per tenant.
func tenancyCases() []attackCase {
	return nil
}
