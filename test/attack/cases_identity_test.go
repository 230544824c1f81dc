package attack

// identityCases are the cases of issue 29 about operator identities per tenant, nonce expiry, stolen-certificate renewal (findings 7 and 8).
func identityCases() []attackCase {
	return nil
}
