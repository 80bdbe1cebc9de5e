#!/bin/sh
# Install (or, with --uninstall, remove) this unpacked ONNX Local LLM for the current user:
# a launcher in ~/.local/bin, a menu entry and the icon. The program stays in this folder.
# Run it as root with PREFIX=/usr/local to install for every user.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-${HOME}/.local}
APPS="${PREFIX}/share/applications"
ICONS="${PREFIX}/share/icons/hicolor"
BIN="${PREFIX}/bin"
NAME=onnx-local-llm

if [ "${1:-}" = "--uninstall" ]; then
  rm -f "${BIN}/${NAME}" "${APPS}/${NAME}.desktop"
  for size in 16 24 32 48 64 128 256 512; do
    rm -f "${ICONS}/${size}x${size}/apps/${NAME}.png"
  done
  rm -f "${ICONS}/scalable/apps/${NAME}.svg"
  echo "Removed the launcher and menu entry. Delete ${HERE} to remove the program;"
  echo "chats and settings stay in ~/.local/share/${NAME} and ~/.config/${NAME}."
  exit 0
fi

mkdir -p "${BIN}" "${APPS}" "${ICONS}/scalable/apps"
ln -sf "${HERE}/${NAME}/${NAME}" "${BIN}/${NAME}"
for size in 16 24 32 48 64 128 256 512; do
  if [ -f "${HERE}/icons/app-${size}.png" ]; then
    mkdir -p "${ICONS}/${size}x${size}/apps"
    cp "${HERE}/icons/app-${size}.png" "${ICONS}/${size}x${size}/apps/${NAME}.png"
  fi
done
cp "${HERE}/icons/app.svg" "${ICONS}/scalable/apps/${NAME}.svg"
sed -e "s|^Exec=.*|Exec=\"${HERE}/${NAME}/${NAME}\" %U|" \
    -e "s|^TryExec=.*|TryExec=${HERE}/${NAME}/${NAME}|" \
    "${HERE}/${NAME}.desktop" > "${APPS}/${NAME}.desktop"
chmod 644 "${APPS}/${NAME}.desktop"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "${APPS}" || true
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "${ICONS}" || true
echo "Installed: run '${NAME}' or find 'ONNX Local LLM' in the applications menu."
case ":${PATH}:" in *":${BIN}:"*) ;; *) echo "(add ${BIN} to PATH to run it by name)";; esac
