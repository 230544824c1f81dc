// Package events fans server events out to watchers. A Hub keeps any number
// of subscribers per tenant; every event published for a tenant is delivered
// to each of that tenant's subscribers and to no other tenant's. Delivery
// never blocks the publisher: a subscriber whose buffer is full is
// disconnected with ErrSlow (its stream ends and the client resynchronises),
// so no watcher silently misses an event.
package events
