// Package adminserve guards `nstance-admin serve`: the token it requires
// on every request (LoadOrCreateToken keeps it in a 0600 file next to the
// context file) and Handler, which refuses, before any page or API handler
// runs, a Host that is not serve's own (DNS rebinding: 421), an Origin of
// another site (403), a request without the token (401) and a body that is
// not application/json (415), and bounds every body. Every refusal is a
// JSON {"error": "..."}.
package adminserve
