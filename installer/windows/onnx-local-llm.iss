; Inno Setup 6 script: Windows installer for the PyInstaller bundle dist\onnx-local-llm\.
;
; Build (on Windows, in the repository root, from a fresh virtual environment):
;   py -3.11 -m venv .venv
;   .venv\Scripts\pip install -e .[directml,app,package]
;   bash installer/build        (or: .venv\Scripts\python installer\build.py)
; installer/build runs PyInstaller and then this script when iscc.exe is on PATH. By hand:
;   iscc /DAppVersion=0.1.0 installer\windows\onnx-local-llm.iss
; Output: dist\onnx-local-llm-<version>-setup.exe
;
; The bundle must be built with onnxruntime-directml (installer/build checks it): DirectML
; runs on any DirectX 12 GPU (NVIDIA, AMD, Intel) and falls back to the CPU.

#define AppName "ONNX Local LLM"
#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppExeName "onnx-local-llm.exe"
#define AppPublisher "ONNX Local LLM contributors"
#ifndef DistDir
  #define DistDir "..\..\dist"
#endif

[Setup]
; AppId identifies the app for upgrades and the uninstaller: never change it.
AppId={{6F2B8C1E-4D7A-4E39-9B51-0C3A5E7D2F14}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher={#AppPublisher}
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; a per-user install needs no administrator rights; the dialog offers all users too
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#DistDir}
OutputBaseFilename=onnx-local-llm-{#AppVersion}-setup
SetupIconFile=..\..\resources\icons\app.ico
UninstallDisplayIcon={app}\{#AppExeName}
UninstallDisplayName={#AppName}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
; the whole one-folder bundle: both executables (the app and its console twin for
; --selftest), _internal\ with Python, Qt, ONNX Runtime (DirectML) and resources\
Source: "{#DistDir}\onnx-local-llm\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\{#AppExeName}"; Comment: "Chat and code completion with local ONNX models"
Name: "{group}\{#AppName} self-test"; Filename: "{cmd}"; Parameters: "/k ""{app}\onnx-local-llm-cli.exe"" --selftest"; WorkingDir: "{app}"
Name: "{group}\{cm:UninstallProgram,{#AppName}}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExeName}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExeName}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallRun]
; stop a worker that is still running, so that its files can be removed
Filename: "{sys}\taskkill.exe"; Parameters: "/F /T /IM {#AppExeName}"; Flags: runhidden; RunOnceId: "StopApp"

[UninstallDelete]
; only the program folder: chats, settings and downloaded models stay in
; %LOCALAPPDATA%\onnx-local-llm (delete that folder to remove them too)
Type: filesandordirs; Name: "{app}\_internal"
