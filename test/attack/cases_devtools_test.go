package attack

// devToolCases are the cases of issue 29 about dev-s3 and dev-k8s seen from a browser: CORS, DNS rebinding, file modes (findings 1 and 10).
func devToolCases() []attackCase {
	return nil
}
