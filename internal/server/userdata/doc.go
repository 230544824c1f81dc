// Package userdata is an instance's own bootstrap data, kept apart from the
// agent's: what a tenant sends with UpsertGroup or CreateInstance (e.g. a
// Cluster API bootstrap data secret's value), stored encrypted and
// addressed by its SHA-256 (Store), or else the template's userdata
// rendered per instance as a Go template (Render). Providers receive the
// result in provider.CreateRequest.UserData and deliver it beside the
// agent's bootstrap, never instead of it.
package userdata
