// Package contextcmd defines `nstance-admin context set|use|list|show|delete`,
// which edit the context file (package contextfile) so the connection flags
// need not be repeated on every command.
package contextcmd
