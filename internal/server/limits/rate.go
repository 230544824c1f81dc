package limits

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// KeyedRate is a token bucket per key (golang.org/x/time/rate) over a bounded
// key set. A key whose bucket has refilled is indistinguishable from a new
// one, so it is dropped when room is needed; when every tracked key is still
// draining, a new key is refused until one refills.
type KeyedRate struct {
	limit   rate.Limit
	burst   int
	maxKeys int
	now     func() time.Time

	mu        sync.Mutex
	buckets   map[string]*rate.Limiter
	lastSweep time.Time
}

// NewKeyedRate allows perMinute events per key with the given burst, tracking
// at most maxKeys keys. now is the clock (time.Now when nil).
func NewKeyedRate(perMinute, burst, maxKeys int, now func() time.Time) *KeyedRate {
	if now == nil {
		now = time.Now
	}
	return &KeyedRate{limit: rate.Limit(float64(perMinute) / 60), burst: max(1, burst), maxKeys: max(1, maxKeys), now: now,
		buckets: map[string]*rate.Limiter{}}
}

// Decision is the outcome of one Allow call.
type Decision int

// Decisions.
const (
	Allowed Decision = iota
	// RateExceeded: the key's bucket is empty.
	RateExceeded
	// TooManyKeys: the key is new and the key set is full of draining buckets.
	TooManyKeys
)

// Allow takes one token from key's bucket.
func (k *KeyedRate) Allow(key string) Decision {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	b, ok := k.buckets[key]
	if !ok {
		if len(k.buckets) >= k.maxKeys && !k.sweepLocked(now) {
			return TooManyKeys
		}
		b = rate.NewLimiter(k.limit, k.burst)
		k.buckets[key] = b
	}
	if !b.AllowN(now, 1) {
		return RateExceeded
	}
	return Allowed
}

// Reserve takes one token from key's bucket and reports how long until it is
// due (0: now). cancel returns the token when the caller does not act on it.
// A new key beyond the key set gets ok false.
func (k *KeyedRate) Reserve(key string) (wait time.Duration, cancel func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	b, found := k.buckets[key]
	if !found {
		if len(k.buckets) >= k.maxKeys && !k.sweepLocked(now) {
			return 0, func() {}, false
		}
		b = rate.NewLimiter(k.limit, k.burst)
		k.buckets[key] = b
	}
	r := b.ReserveN(now, 1)
	if !r.OK() {
		return 0, func() {}, false
	}
	return r.DelayFrom(now), func() { r.CancelAt(k.now()) }, true
}

// sweepLocked drops every refilled bucket and reports whether there is room.
// A full sweep runs at most once a second, so a flood of new keys costs
// O(keys) only that often.
func (k *KeyedRate) sweepLocked(now time.Time) bool {
	if now.Sub(k.lastSweep) < time.Second {
		return false
	}
	k.lastSweep = now
	for key, b := range k.buckets {
		if b.TokensAt(now) >= float64(k.burst) {
			delete(k.buckets, key)
		}
	}
	return len(k.buckets) < k.maxKeys
}

// Keys is how many keys are tracked now.
func (k *KeyedRate) Keys() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.buckets)
}
