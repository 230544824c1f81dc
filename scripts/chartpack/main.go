// Command chartpack rewrites a chart archive made by `helm package` so that
// packaging one commit twice gives the same bytes: helm stamps every tar
// entry with the time of packaging. Entries keep their order, names, modes
// and contents; their times become -mtime (the release's commit time) and
// the gzip header keeps helm's marker fields without a time.
//
//	go run ./scripts/chartpack -mtime 1764201600 dist/v0.3.0/charts/nstance-server-v0.3.0.tgz
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	mtime := flag.Int64("mtime", -1, "seconds since the epoch every entry gets (required; release.sh passes SOURCE_DATE_EPOCH)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: chartpack -mtime SECONDS CHART.tgz...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *mtime < 0 || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "chartpack: -mtime and at least one chart archive are required (see -h)")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		if err := rewrite(path, time.Unix(*mtime, 0).UTC()); err != nil {
			fmt.Fprintf(os.Stderr, "chartpack: %s: %v\n", path, err)
			os.Exit(1)
		}
	}
}

// rewrite replaces the archive at path with its normalised form.
func rewrite(path string, mtime time.Time) error {
	in, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := Normalize(in, mtime)
	if err != nil {
		return err
	}
	tmp := path + ".chartpack"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Normalize returns the gzip-compressed tar archive in with every entry's
// times set to mtime and owner fields cleared; order, names, modes, types
// and contents are kept.
func Normalize(in []byte, mtime time.Time) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(in))
	if err != nil {
		return nil, fmt.Errorf("not a gzip archive: %w", err)
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	zw.Header = gzip.Header{Name: zr.Header.Name, Comment: zr.Header.Comment, Extra: zr.Header.Extra, OS: 255}
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read tar entry: %w", err)
		}
		h.ModTime, h.AccessTime, h.ChangeTime = mtime, time.Time{}, time.Time{}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX
		h.PAXRecords = nil
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write tar entry %s: %w", h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, fmt.Errorf("copy tar entry %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
