// Package agentapi is the server side of the Agent gRPC service. Callers are
// identified by their verified agent certificate (authz puts the identity in
// the context). KeyGenRequests streams the keys the instance's template asks
// for; SubmitPublicKeys checks and stores the public halves (KeyStore) and
// issues the certificates the template wants (Signer); ReceiveFiles streams
// the instance's rendered files plus issued certificates with a hash over the
// whole set (Source); ReportHealth records every report in the term's live table
// (agentlive, which also counts the open streams) and,
// when the agent's config hash differs from the current one, pushes the files
// again (runtime config drift). Notify re-plans instances after a config
// change and pushes what changed to connected agents.
package agentapi
