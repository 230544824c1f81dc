package attack

import "sync"

// devToolCases are the cases of issue 29 about dev-s3 and dev-k8s seen from a browser: CORS, DNS rebinding, file modes (findings 1 and 10).
func devToolCases() []attackCase {
	// dev-k8s is not part of the stack: the first case that needs it builds
	// and starts one (stopped by PID when the test ends).
	k8s := &devK8sOnce{}
	return []attackCase{
		{name: "dev-s3 answers a cross-origin preflight and GET without CORS headers", run: devS3NoCORS},
		{name: "dev-s3 refuses a rebinding Host name (nothing read or written)", run: devS3RebindingHost},
		{name: "dev-s3 refuses a cross-origin HTML form upload (a simple request, no preflight)", run: devS3FormUpload},
		{name: "dev-k8s sends no CORS headers and refuses a rebinding Host name", run: k8s.run(devK8sCORSAndHost)},
		{name: "dev-k8s stores Secrets 0600 in 0700 directories and tightens existing ones on start", run: k8s.run(devK8sSecretModes)},
	}
}

// devK8sOnce starts dev-k8s for the first case that asks.
type devK8sOnce struct {
	once sync.Once
	k    *devK8s
	err  error
}
