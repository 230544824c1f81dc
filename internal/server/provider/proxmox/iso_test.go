package proxmox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider/proxmox"
)

func TestSeedISO(t *testing.T) {
	ud := []byte("#!/bin/sh\necho hello\n")
	img, err := proxmox.BuildSeedISO(proxmox.SeedFiles{UserData: ud, MetaData: proxmox.MetaData("web-1"),
		NetworkConfig: []byte("version: 2\nethernets: {}\n")})
	require.NoError(t, err)
	label, files, err := proxmox.ReadSeedISO(img)
	require.NoError(t, err)
	require.Equal(t, proxmox.SeedLabel, label, "cloud-init's NoCloud source looks for the label cidata")
	require.Equal(t, map[string][]byte{"user-data": ud, "meta-data": []byte("instance-id: web-1\nlocal-hostname: web-1\n"),
		"network-config": []byte("version: 2\nethernets: {}\n")}, files)

	img, err = proxmox.BuildSeedISO(proxmox.SeedFiles{UserData: ud, MetaData: proxmox.MetaData("web-2")})
	require.NoError(t, err)
	_, files, err = proxmox.ReadSeedISO(img)
	require.NoError(t, err)
	require.NotContains(t, files, "network-config")

	_, err = proxmox.BuildSeedISO(proxmox.SeedFiles{MetaData: proxmox.MetaData("x")})
	require.ErrorContains(t, err, "user-data and meta-data are required")
}
