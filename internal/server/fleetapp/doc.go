// Package fleetapp plugs the fleet (groups, instances, reconciler, full
// Operator API) into the server app: Factory is an app.ServiceFactory, and
// the returned Lead function runs the reconciler for one shard-leadership
// term. Instance record writes are mirrored into the app's SQLite cache.
package fleetapp
