package proxmox

import (
	"fmt"
	"sort"
	"strings"
)

// NodeLoad is what placement knows of one node.
type NodeLoad struct {
	Name   string
	Online bool
	// FreeMem is the node's unused memory in bytes.
	FreeMem uint64
	// Members counts the group's VMs on the node (those being created
	// included).
	Members int
}

// ChooseNode picks the node a new member of a group goes to: among the
// online nodes with at least need bytes free (need 0: any), the one with
// the fewest members of the group, then the most free memory, then the
// first name. It fails naming why when no node qualifies.
func ChooseNode(nodes []NodeLoad, need uint64) (string, error) {
	var ok []NodeLoad
	var why []string
	for _, n := range nodes {
		switch {
		case !n.Online:
			why = append(why, n.Name+" offline")
		case n.FreeMem < need:
			why = append(why, fmt.Sprintf("%s has %d MiB free", n.Name, n.FreeMem>>20))
		default:
			ok = append(ok, n)
		}
	}
	if len(ok) == 0 {
		if len(nodes) == 0 {
			return "", fmt.Errorf("no node to place the VM on")
		}
		return "", fmt.Errorf("no node can take a VM of %d MiB: %s", need>>20, strings.Join(why, ", "))
	}
	sort.Slice(ok, func(a, b int) bool {
		x, y := ok[a], ok[b]
		if x.Members != y.Members {
			return x.Members < y.Members
		}
		if x.FreeMem != y.FreeMem {
			return x.FreeMem > y.FreeMem
		}
		return x.Name < y.Name
	})
	return ok[0].Name, nil
}
