// Package adminapp assembles the nstance-admin command line from the
// command packages (cluster, context, config, group, instance, serve).
package adminapp
