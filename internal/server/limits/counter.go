package limits

import "sync"

// Counter caps how many holders one key may have at a time.
type Counter struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// NewCounter returns a Counter allowing max concurrent holders per key.
func NewCounter(max int) *Counter { return &Counter{max: max, n: map[string]int{}} }

// Max is the per-key cap.
func (c *Counter) Max() int { return c.max }

// Acquire takes a slot for key. When the key is at its cap it returns false;
// otherwise release gives the slot back (calling it more than once is safe).
func (c *Counter) Acquire(key string) (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= c.max {
		return nil, false
	}
	c.n[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[key]--; c.n[key] <= 0 {
				delete(c.n, key) // the map holds only keys with holders
			}
		})
	}, true
}

// Count is how many holders key has now.
func (c *Counter) Count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// Keys is how many keys have holders now.
func (c *Counter) Keys() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.n)
}
