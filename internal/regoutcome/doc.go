// Package regoutcome classifies the errors of the Registration service's
// calls (RegisterAgent, RegisterOperator) into what a client does next:
// retry with backoff, retry within a clock-skew allowance, or give up. The
// agent and the operator both follow it, so the codes the service documents
// mean the same to every client.
package regoutcome
