package clustercmd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/cmdutil"
	"github.com/nstance-dev/nstance/internal/admin/output"
	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// maxSecretValue bounds what `cluster secret put` stores: no server
// delivers a file larger than its largest possible message.
const maxSecretValue = config.MaxMessageBytesCap

// sealedFlags are the flags of commands that read or write sealed
// secrets: storage, the encryption key, extra, output and logging.
func sealedFlags(extra ...cli.Flag) []cli.Flag {
	fl := append(storageFlags(), keyFlags()...)
	fl = append(fl, extra...)
	fl = append(fl, outputFlag())
	return append(fl, cmdutil.LogFlags()...)
}

// secretCommand is `cluster secret`: the file secrets template files of
// kind secret (source cluster) deliver, sealed in object storage.
func secretCommand() *cli.Command {
	flags := sealedFlags
	return &cli.Command{
		Name:  "secret",
		Usage: "manage the file secrets that template files of kind secret deliver (sealed with the cluster encryption key)",
		Subcommands: []*cli.Command{
			{
				Name:      "put",
				Usage:     "store (or replace) a file secret; the value is read from --from-file or standard input, never from an argument",
				ArgsUsage: "NAME",
				Flags: flags(&cli.StringFlag{Name: "from-file", Value: "-",
					Usage: "file holding the value (\"-\": standard input); taken byte for byte, a trailing newline included"}),
				Action: secretPut,
			},
			{Name: "list", Usage: "list the file secrets (names, sizes, sealing key; never values)", Flags: flags(), Action: secretList},
			{Name: "delete", Usage: "delete a file secret (instances keep the copy they hold; its files are reported missing)",
				ArgsUsage: "NAME", Flags: flags(), Action: secretDelete},
		},
	}
}

func secretName(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("want exactly one argument, the secret name (the value comes from --from-file or standard input)")
	}
	name := c.Args().First()
	if err := layout.ValidateID("secret name", name); err != nil {
		return "", err
	}
	return name, nil
}

func readValue(c *cli.Context) ([]byte, error) {
	var r io.Reader
	src := c.String("from-file")
	if src == "-" || src == "" {
		src, r = "standard input", c.App.Reader
		if r == nil {
			r = os.Stdin
		}
	} else {
		f, err := os.Open(src)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	v, err := io.ReadAll(io.LimitReader(r, maxSecretValue+1))
	if err != nil {
		return nil, fmt.Errorf("reading the value from %s: %w", src, err)
	}
	switch {
	case len(v) == 0:
		return nil, fmt.Errorf("the value read from %s is empty", src)
	case len(v) > maxSecretValue:
		return nil, fmt.Errorf("the value read from %s is larger than %d bytes", src, maxSecretValue)
	}
	return v, nil
}

func secretPut(c *cli.Context) error {
	name, err := secretName(c)
	if err != nil {
		return err
	}
	p, err := printer(c, c.App.Writer)
	if err != nil {
		return err
	}
	value, err := readValue(c)
	if err != nil {
		return err
	}
	_, keys, sec, err := secretStore(c.Context, c)
	if err != nil {
		return err
	}
	key := keys.FileSecret(name)
	if err := sec.Put(c.Context, key, value, objstore.PutOptions{}); err != nil {
		return err
	}
	if p.Machine() {
		return p.Document(secretInfo{Name: name, Key: key, Bytes: len(value), KeyID: sec.Ring.CurrentID()})
	}
	return p.Fields("secret", name, "key", key, "bytes", fmt.Sprint(len(value)), "key id", sec.Ring.CurrentID())
}

type secretInfo struct {
	Name         string `json:"name"`
	Key          string `json:"key"`
	Bytes        int    `json:"bytes,omitempty"`
	KeyID        string `json:"key_id,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
}

func secretList(c *cli.Context) error {
	p, err := printer(c, c.App.Writer)
	if err != nil {
		return err
	}
	objs, keys, err := store(c.Context, c)
	if err != nil {
		return err
	}
	prefix := keys.FileSecretPrefix()
	infos, err := objs.List(c.Context, prefix)
	if err != nil {
		return fmt.Errorf("listing %s: %w", prefix, err)
	}
	items := make([]output.Object, 0, len(infos))
	rows := output.Rows{Header: []string{"NAME", "SEALED BYTES", "KEY ID", "AGE"}}
	for _, info := range infos {
		name := strings.TrimPrefix(info.Key, prefix)
		kid := "?"
		if obj, err := objs.Get(c.Context, info.Key); err == nil {
			if id, err := secrets.EnvelopeKeyID(obj.Body); err == nil {
				kid = id
			}
		} else if errors.Is(err, objstore.ErrNotFound) {
			continue // deleted since the listing
		}
		items = append(items, secretInfo{Name: name, Key: info.Key, Bytes: int(info.Size), KeyID: kid,
			LastModified: info.LastModified.UTC().Format("2006-01-02T15:04:05Z")})
		rows.Add(name, fmt.Sprint(info.Size), kid, p.Age(info.LastModified))
	}
	if p.Machine() {
		return p.Document(output.List{Items: items})
	}
	return p.Table(rows)
}

func secretDelete(c *cli.Context) error {
	name, err := secretName(c)
	if err != nil {
		return err
	}
	p, err := printer(c, c.App.Writer)
	if err != nil {
		return err
	}
	objs, keys, err := store(c.Context, c)
	if err != nil {
		return err
	}
	key := keys.FileSecret(name)
	if _, err := objs.Head(c.Context, key); errors.Is(err, objstore.ErrNotFound) {
		return fmt.Errorf("file secret %q does not exist (%s)", name, key)
	} else if err != nil {
		return fmt.Errorf("reading %s: %w", key, err)
	}
	if err := objs.Delete(c.Context, key); err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	if p.Machine() {
		return p.Document(secretInfo{Name: name, Key: key})
	}
	return p.Fields("deleted", name, "key", key)
}
