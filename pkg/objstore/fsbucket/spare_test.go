package fsbucket

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"testing"
)

// Overwrites recycle replaced bodies; a concurrent reader must still get a
// complete body of the key it asked for, with a matching ETag.
func TestRecycledBodiesNeverReachReaders(t *testing.T) {
	b, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := []string{"a/x", "a/y", "b/z"}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				k := keys[(w+i)%len(keys)]
				body := bytes.Repeat([]byte(fmt.Sprintf("%s#%d.%d;", k, w, i)), 50+i%7)
				if _, err := b.Put(ctx, k, bytes.NewReader(body), nil, Conditions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				k := keys[(r+i)%len(keys)]
				f, info, err := b.Open(ctx, k)
				if err != nil {
					continue // not written yet
				}
				data, err := io.ReadAll(f)
				f.Close()
				sum := md5.Sum(data)
				if err != nil || !bytes.HasPrefix(data, []byte(k+"#")) || int64(len(data)) != info.Size || hex.EncodeToString(sum[:]) != info.ETag {
					errs <- fmt.Errorf("read %s: got %d bytes %.20q, info %+v, err %v", k, len(data), data, info, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
